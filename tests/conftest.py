"""Shared fixtures: real tiny models and trainers built by the project itself."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import subprocess
from pathlib import Path

import pytest
import torch


def session_root(tmp_path_factory) -> Path:
    """The session's temporary folder, one for all of its xdist workers (each has its own below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """The session's base-model cache (``PRL_CACHE``), shared by its xdist workers."""
    d = session_root(tmp_path_factory) / "cache"
    d.mkdir(exist_ok=True)
    os.environ["PRL_CACHE"] = str(d)
    return d


BUILD_LOG = "tiny-base-build.log"  # in cache_dir: what the session's tiny base-model build printed


@pytest.fixture(scope="session")
def tiny_base(cache_dir) -> Path:
    """The embedded 'tiny' base model, SFT warm start included (about 15 s on 2 cores), built once
    per session: the first worker to ask builds it, the others wait on its lock."""
    from filelock import FileLock

    from runners.task.basemodel import ensure_base_model
    from runners.task.tasks import ArithmeticTask

    said: list[str] = []
    with FileLock(str(cache_dir / "tiny-base.lock")):
        path = ensure_base_model("tiny", ArithmeticTask(), cache_dir / "base-models", log=said.append)
        if said:
            (cache_dir / BUILD_LOG).write_text("".join(line + "\n" for line in said))
    return path


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory) -> Path:
    """An untrained tiny Llama with the project's tokenizer, saved like any HF checkpoint."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from runners.task.tokenizer import build_tokenizer

    out = tmp_path_factory.mktemp("random-model")
    tok = build_tokenizer(out)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(str(out))
    return out


def run_in_process(tool: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m runners ARGS`` (or analysis, scalefit) run in this process as its ``__main__`` runs
    it, as a CompletedProcess (returncode, stdout, stderr). An exception escaping the command, which
    would print a traceback, fails the test. Error messages are checked so, without 2-5 s of imports
    each; every command line still runs in a process of its own somewhere in the suite for the exit
    code and stderr of the real thing (``test_a_bad_campaign_file_is_one_line_from_the_shell``, ...)."""
    from scalefit.cli import run_cli

    main = importlib.import_module(f"{tool}.cli").main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = run_cli(lambda: main(list(args)))
        except SystemExit as e:  # argparse: exit 2 with its usage on stderr (0 after --help), as in a shell
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    return subprocess.CompletedProcess([tool, *args], code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli():
    """``cli("runners", *args)``: :func:`run_in_process`."""
    return run_in_process


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI (``CI`` set, as ``.ci/run`` runs), a skipped test is an error: a missing PostgreSQL,
    Chromium or root must not turn into a pass."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, which counts as a failure: {reason}"


def pytest_collection_modifyitems(config, items):
    """The slow tests (``@pytest.mark.slow``: end to end, seconds to minutes each) first, then the
    quick ones, each in collection order: with ``make test``'s xdist workers the quick tests fill
    the end, so no worker waits alone on a long test at the end of the session."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)

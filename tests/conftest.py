"""Shared fixtures: real tiny models and trainers built by the project itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cache")
    os.environ["PRL_CACHE"] = str(d)
    return d


BUILD_LOG: list[str] = []  # what the session's tiny base-model build printed


@pytest.fixture(scope="session")
def tiny_base(cache_dir) -> Path:
    """The embedded 'tiny' base model, SFT warm start included (about 15 s on 2 cores)."""
    from runners.task.basemodel import ensure_base_model
    from runners.task.tasks import ArithmeticTask

    return ensure_base_model("tiny", ArithmeticTask(), cache_dir / "base-models", log=BUILD_LOG.append)


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

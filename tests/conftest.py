"""Shared fixtures: real tiny models and trainers built by the project itself."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def session_root(tmp_path_factory) -> Path:
    """The session's temporary folder, one for all of its xdist workers (each has its own below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_cache(root: Path) -> Path:
    d = root / "cache"
    d.mkdir(exist_ok=True)
    return d


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """The session's base-model cache (``PRL_CACHE``), shared by its xdist workers."""
    d = shared_cache(session_root(tmp_path_factory))
    os.environ["PRL_CACHE"] = str(d)
    return d


BUILD_LOG = "tiny-base-build.log"  # in cache_dir: what the session's tiny base-model build printed


def build_tiny_base(cache_dir: Path) -> Path:
    """The embedded 'tiny' base model in ``cache_dir``, built by the first process to ask (the others
    wait on its lock); the build's log in ``cache_dir / BUILD_LOG``."""
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
def tiny_base(cache_dir) -> Path:
    """The embedded 'tiny' base model, SFT warm start included (15-60 s on 2 cores), built once per
    session (under xdist, by the controller while the workers start: ``pytest_sessionstart``)."""
    return build_tiny_base(cache_dir)


PREBUILD: list[subprocess.Popen] = []  # the controller's base-model build, under xdist


def pytest_configure(config):
    """Each xdist worker gets its share of the cores, for torch in the worker and for every process it
    starts (``OMP_NUM_THREADS``, which a campaign passes on to its runs). Oversubscribed OpenMP
    threads spin: three tiny base-model builds at once on 2 cores took 99-138 s and 66-106 s of CPU
    each with torch's default threads, 28-29 s and 20 s each with one thread. The SLURM backend
    polls squeue every second, not every 5 s (``PRL_SLURM_POLL_S``): a job's end is seen sooner. Under CI
    no test is left out (:func:`refuse_a_selection_under_ci`): the slow tier runs too."""
    os.environ.setdefault("PRL_SLURM_POLL_S", "1")
    refuse_a_selection_under_ci(config)
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers:
        import torch  # here and in the fixtures: a pytest that needs none (tests/test_tiers.py's) starts without it

        from runners.campaign.backends.local import cores

        threads = max(1, cores() // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def refuse_a_selection_under_ci(config) -> None:
    """Under CI no test may be left out by the command line (``make test``'s quick tier is ``-m "not
    slow"``): a marker (``-m``), keyword (``-k``), node id (``--deselect``) or path (``--ignore``,
    ``--ignore-glob``) selection is refused, with pytest's usage error, before any test is collected,
    and so are the cache's ``--lf`` and ``--sw``, which leave out the tests that passed last time; a
    deselection from anywhere else (a plugin) is refused as it happens (:func:`pytest_deselected`)."""
    if not os.environ.get("CI"):
        return
    opt = config.option
    chosen = [f"-m {opt.markexpr!r}"] if opt.markexpr else []
    chosen += [f"-k {opt.keyword!r}"] if opt.keyword else []
    chosen += [f"--deselect {x}" for x in opt.deselect or []]
    chosen += [f"--ignore {x}" for x in opt.ignore or []] + [f"--ignore-glob {x}" for x in opt.ignore_glob or []]
    chosen += [x for x, on in (("--lf", "lf"), ("--sw", "stepwise")) if getattr(opt, on, None)]  # the cache's
    if chosen:
        raise pytest.UsageError(
            f"under CI every test runs, so a selection ({', '.join(chosen)}) is refused: "
            "make test runs every tier where CI is set (TESTS=all); run the command without it"
        )


def pytest_deselected(items):
    """Under CI, a test deselected by anything not refused as the command line is read
    (:func:`refuse_a_selection_under_ci`): a plugin. Refused, naming the first (under xdist a worker's
    collection, so pytest-xdist reports an internal error: still no pass)."""
    if os.environ.get("CI") and items:
        raise pytest.UsageError(
            f"under CI every test runs, so deselecting {len(items)} of them ({items[0].nodeid}, ...) is refused: "
            "make test runs every tier where CI is set (TESTS=all); run it without the plugin that deselects them"
        )


def pytest_sessionstart(session):
    """Under xdist, the controller starts the session's tiny base-model build in a process of its
    own, while the workers run the slow tests that need none (ordered first:
    ``pytest_collection_modifyitems``); a worker that needs it first waits on its lock."""
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    cache = shared_cache(config._tmp_path_factory.getbasetemp())  # the workers' session_root
    code = f"from pathlib import Path; from tests.conftest import build_tiny_base as b; b(Path({str(cache)!r}))"
    env = {"OMP_NUM_THREADS": "1", **os.environ}  # beside the workers, which hold every core (pytest_configure)
    with (cache / "tiny-base-prebuild.out").open("w") as out:
        PREBUILD.append(
            subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        )


def pytest_sessionfinish(session):
    for proc in PREBUILD:  # done long before the end, unless the session was cut short
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def store_template(tmp_path_factory) -> Path:
    """An empty MLflow SQLite store at the installed MLflow's schema, made once per session. A test's
    new store is a copy of it (:func:`empty_store`): the same empty store, without MLflow creating
    its tables and running its migrations again (3-6 s a store on 2 cores)."""
    from filelock import FileLock

    path = session_root(tmp_path_factory) / "empty-mlflow.db"
    with FileLock(f"{path}.lock"):
        if not path.is_file():
            from mlflow.tracking import MlflowClient

            tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
            with pytest.MonkeyPatch.context() as mp:
                mp.chdir(path.parent)  # the Default experiment's artifact folder: beside it, never in the project
                MlflowClient(f"sqlite:///{tmp}").search_experiments()
            tmp.rename(path)
    return path


def empty_store(template: Path, db: Path) -> str:
    """A new empty MLflow store at ``db`` (a copy of the session's ``store_template``); its URI."""
    shutil.copyfile(template, db)
    return f"sqlite:///{db}"


@pytest.fixture(scope="session")
def session_server(tmp_path_factory, store_template) -> Iterator[str]:
    """An MLflow tracking server in front of a SQLite store, one per xdist worker, for the campaign
    tests whose subject is not the campaign's own server: a campaign tracked to a server starts
    none (~7 s of CPU and a wait for each campaign on 2 cores). Each test names its own experiment.
    The tests of the server a campaign starts, and of kills that take it down, keep a store each
    (``own_store``)."""
    from runners.tracking.mlflow_server import local_server

    root = tmp_path_factory.mktemp("session-server")
    uri = empty_store(store_template, root / "mlflow.db")
    with local_server(uri, root / "artifacts", log=lambda m: None) as url:
        yield url


@pytest.fixture
def store(tmp_path, monkeypatch, tiny_base, session_server) -> str:
    """The worker's session server (``MLFLOW_TRACKING_URI``), run from ``tmp_path`` as ``make
    ablation`` runs from the project: the campaign's folders land in it."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", session_server)
    monkeypatch.chdir(tmp_path)
    return session_server


@pytest.fixture
def own_store(tmp_path, monkeypatch, tiny_base, store_template) -> str:
    """A SQLite store of the test's own (``MLFLOW_TRACKING_URI``), run from ``tmp_path``: a campaign
    on it starts its own tracking server, as ``make ablation`` does."""
    uri = empty_store(store_template, tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    return uri


@pytest.fixture(scope="session")
def concurrent_campaign(tmp_path_factory, tiny_base, store_template) -> dict:
    """A tiny LOO campaign of two axes, three runs trained at once (``parallel: 3``: baseline,
    loss=dapo, sampling=uniform, 4 steps) through its local MLflow server into a SQLite store, run
    once per session (the first xdist worker to ask runs it, the others wait on its lock) and read
    by the tests of what a campaign leaves (their xdist group keeps them on one worker, one after
    another): what lands in MLflow, that its runs ran together and lost no metric, the MLflow UI's
    REST API and a browser's first visit. They only read it, except that the browser test's
    ``analysis fit`` adds the fitted table to the parent run and each run's report, and its check
    of a run of an earlier version adds one and deletes it. Returns the folder it ran in
    (``root``), the campaign file (``path``), the store URI (``store``), ``ran``, ``failures``
    and the campaign's log ``lines``."""
    from filelock import FileLock

    from runners.campaign.runs import run_campaign
    from tests.campaigns import write_campaign

    root = session_root(tmp_path_factory) / "concurrent-campaign"
    store, path, result = f"sqlite:///{root / 'mlflow.db'}", root / "conc.yaml", root / "result.json"
    with FileLock(str(root.parent / "concurrent-campaign.lock")):
        if not result.is_file():
            root.mkdir(exist_ok=True)
            empty_store(store_template, root / "mlflow.db")
            axes = {
                "loss": {"key": "algorithm.loss", "values": ["cispo", "dapo"]},
                "sampling": {"key": "algorithm.sampling", "values": ["no_positive_resampling", "uniform"]},
            }
            write_campaign(path, "concurrent", 4, axes, parallel=3)
            lines: list[str] = []
            with pytest.MonkeyPatch.context() as mp:  # as `make ablation` runs it: from its folder, on its store
                mp.chdir(root)
                mp.setenv("MLFLOW_TRACKING_URI", store)
                summary = run_campaign(path, log=lines.append)
            failures = [f"{spec.variant} seed {spec.seed}: {why}" for spec, why in summary["failures"]]
            result.write_text(json.dumps({"ran": summary["ran"], "failures": failures, "lines": lines}))
    return {**json.loads(result.read_text()), "root": root, "path": path, "store": store}


SMALL_RUN = [  # the distributed tests' run: 4 steps, 2 evaluations of 9 prompts, over 1 or 2 processes
    "model.size=tiny",
    "batch.prompts=2",
    "batch.generations=4",
    "batch.micro_batch=8",
    "length.control=interruption",
    "length.think_budget=[4, 10]",
    "length.answer_budget=6",
    "train.steps=4",
    "train.save_every=2",
    "eval.every=2",
    "eval.prompts=9",  # 5 and 4 prompts over 2 processes: the second runs out one generate call early
    "eval.samples=4",
    "eval.batch_prompts=4",
]


def cpu_only_env(**extra: str) -> dict[str, str]:
    """This process's environment with CUDA hidden (``CUDA_VISIBLE_DEVICES`` empty), plus ``extra``:
    a test of the CPU path (gloo DDP, FSDP 2 on CPU processes, refusals for machines without CUDA)
    runs that path on a GPU machine too, instead of skipping there (a skip fails under ``CI``)."""
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", **extra}


@contextlib.contextmanager
def tmpfs(where: Path, size_kib: int):
    """A tmpfs of ``size_kib`` mounted at ``where`` for the block; skips the test where this
    process may not mount (mounting needs root, CAP_SYS_ADMIN)."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()[:200]}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def remount(where: Path, options: str) -> None:
    """Mount ``where`` (a :func:`tmpfs`) again with ``options``: ``ro``, or a new ``size=``."""
    subprocess.run(["mount", "-o", f"remount,{options}", str(where)], check=True)


def train_small_run(run_dir: Path, processes: int) -> list[dict]:
    """``runners train`` of :data:`SMALL_RUN` over ``processes`` (``--gpus``: DDP through accelerate,
    gloo on CPU, also on a GPU machine), tracked to ``mlflow.db`` beside ``run_dir``; its metrics records."""
    cmd = [sys.executable, "-m", "runners", "train", "scalerl", *[f"--set={s}" for s in SMALL_RUN]]
    cmd += ["--run-dir", str(run_dir), "--gpus", str(processes), "--new-store"]  # the store beside it is new
    env = cpu_only_env(MLFLOW_TRACKING_URI=f"sqlite:///{run_dir.parent / 'mlflow.db'}")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return metrics_records(run_dir)


def metrics_records(run_dir: Path) -> list[dict]:
    """A run folder's evaluation records (``metrics.jsonl``), in order."""
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory, tiny_base) -> Path:
    """:data:`SMALL_RUN` over two DDP processes, once per worker: what a run over one process
    (tests/test_distributed.py) and FSDP's sharded run (tests/test_fsdp.py) are compared with.
    Their tests share an xdist group, so one worker runs it. Its folder; the store beside it."""
    run_dir = tmp_path_factory.mktemp("ddp") / "two"
    train_small_run(run_dir, 2)
    return run_dir


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory) -> Path:
    """An untrained tiny Llama with the project's tokenizer, saved like any HF checkpoint."""
    import torch
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
    each; every command (``runners campaign``, ``analysis fit``, ...) still runs in a process of its
    own somewhere in the suite for the exit code and stderr of the real thing
    (``test_a_bad_campaign_file_is_one_line_from_the_shell``, the browser test's ``analysis fit``, ...)."""
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


def fail_a_skip_under_ci(report) -> None:
    """Under CI (``CI`` set, as ``.ci/run`` sets it), a skip is a failure: a missing PostgreSQL,
    Chromium, uv, tmpfs or root must not turn into a pass. No skip is tolerated, on any machine: the
    tests of the CPU path hide CUDA from the processes they start (:func:`cpu_only_env`), so a GPU
    machine runs them too; an expected failure (``xfail``) stays one."""
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, which counts as a failure: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test skipped as it runs (``pytest.skip`` in it or its fixture, a ``skipif``): :func:`fail_a_skip_under_ci`."""
    fail_a_skip_under_ci((yield).get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module skipped as it is collected (``pytest.skip(..., allow_module_level=True)``, a
    module-level ``pytest.importorskip``): :func:`fail_a_skip_under_ci`, a collection error."""
    fail_a_skip_under_ci((yield).get_result())


def pytest_collection_modifyitems(config, items):
    """The slow tests (``@pytest.mark.slow``: end to end, seconds to minutes each) first: those that
    need no tiny base model (they run while it is built), then the xdist groups (a group is one
    unit of a worker's work, minutes long: the SLURM cluster's tests, the session campaign's), then
    the others; the quick ones last, each in collection order. With ``make test``'s xdist workers
    the quick tests fill the end, so no worker waits alone on a long unit at the end of the session."""

    def order(item) -> tuple[bool, int]:
        slow = item.get_closest_marker("slow") is not None
        tier = 0 if "tiny_base" not in item.fixturenames else 1 if item.get_closest_marker("xdist_group") else 2
        return not slow, tier

    items.sort(key=order)


def documented_module(tmp_path: Path, heading: str, folder: str, file: str) -> Path:
    """The one Python block of docs/extending.md's section ``heading`` ("## Adding a loss"), as the page
    writes it, saved as ``file`` in a new folder ``folder`` under ``tmp_path`` (a folder a plug-in
    package can scan): the docs' example, run by a test as a user would copy it."""
    import re

    page = (ROOT / "docs" / "extending.md").read_text()
    section = page.split(heading, 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    out = tmp_path / folder
    out.mkdir()
    (out / file).write_text(code)
    return out

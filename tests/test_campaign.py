"""Campaigns end to end on CPU with the tiny model: MLflow structure, resume after SIGKILL,
concurrent writers, the fit table, `make ui`'s server (what a browser sees of it, and the REST API
its pages read: tests/test_ui.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from runners.campaign.load import expand, load_campaign
from runners.campaign.runs import run_campaign
from runners.campaign.spec import CampaignError
from runners.tracking.server_processes import free_port
from tests.campaigns import TINY, assert_ran_together, history_steps, trainers, wait_healthy, write_campaign
from tests.conftest import empty_store


def test_loo_expansion_changes_exactly_one_axis(tmp_path):
    camp = load_campaign(
        write_campaign(
            tmp_path / "c.yaml",
            "c",
            4,
            {
                "loss": {"key": "algorithm.loss", "values": ["cispo", "dapo", "gspo"]},
                "zvf": {"key": "algorithm.zero_variance_filter", "values": [True, False]},
            },
            seeds=[0, 1],
        )
    )
    specs = expand(camp)
    assert [(s.variant, s.seed) for s in specs] == [
        (v, s) for v in ("baseline", "loss=dapo", "loss=gspo", "zvf=off") for s in (0, 1)
    ]
    base = specs[0].recipe.flat()
    for s in specs[2:]:
        diff = {k for k, v in s.recipe.flat().items() if base[k] != v} - {"name", "train.seed"}
        assert len(diff) == 1
    assert len({s.run_key for s in specs}) == len(specs)  # identity includes variant and seed
    assert [s.variant for s in expand(camp, "zvf")] == ["baseline", "baseline", "zvf=off", "zvf=off"]


def test_controls_change_exactly_their_keys_and_bad_ones_are_refused(tmp_path):
    controls = {"lr_half": {"optim.lr": 5e-5}, "short": {"length.think_budget": [6, 6], "optim.lr": 2e-4}}
    camp = load_campaign(write_campaign(tmp_path / "c.yaml", "c", 4, {}, controls=controls))
    specs = expand(camp)
    assert [s.variant for s in specs] == ["baseline", "control=lr_half", "control=short"]
    base = specs[0].recipe.flat()
    for spec, over in zip(specs[1:], controls.values(), strict=True):
        diff = {k for k, v in spec.recipe.flat().items() if base[k] != v} - {"name"}
        assert diff == set(over) and spec.axis == "control"
    assert [s.variant for s in expand(camp, only_axis=None)][1:] == ["control=lr_half", "control=short"]
    for bad, msg in (
        ({"x": {"optim.rate": 1e-5}}, "control 'x': 'optim.rate' is not a recipe key"),
        ({"x": {"algorithm.loss": "cispo"}}, "control 'x' changes nothing"),
        ({"x": []}, r"control 'x' needs \{dotted.recipe.key: value"),
    ):
        with pytest.raises(CampaignError, match=msg):
            expand(load_campaign(write_campaign(tmp_path / "bad.yaml", "bad", 4, {}, controls=bad)))


@pytest.mark.slow
def test_packed_runs_share_one_base_model_built_before_they_start(store, tmp_path):
    path = write_campaign(
        tmp_path / "b.yaml",
        "build-once",
        2,
        {"loss": {"key": "algorithm.loss", "values": ["cispo", "dapo"]}},
        parallel=2,
    )
    doc = json.loads(path.read_text())
    doc["overrides"]["data.task.n_train"] = 3000  # a task no other test has built a base model for
    path.write_text(json.dumps(doc))
    lines: list[str] = []
    summary = run_campaign(path, log=lines.append)
    assert not summary["failures"]
    builds = [x for x in lines if x.startswith("building base model")]
    assert len(builds) == 1 and "once for 2 run(s)" in builds[0]
    assert lines.index(builds[0]) < min(i for i, x in enumerate(lines) if " start " in x)
    for variant in ("baseline", "loss=dapo"):  # each run's progress reaches the console as it happens
        steps = [x for x in lines if x.strip().startswith(f"{variant} seed 0: [") and "] step " in x]
        assert len(steps) == 2 and "mean@16" in steps[-1], lines
    for log in (tmp_path / "artifacts/campaigns/build-once").glob("*/run.log"):
        assert "building base model" not in log.read_text()  # neither run built its own


def _kill_tree(pid: int) -> None:
    parent = psutil.Process(pid)
    for p in [*parent.children(recursive=True), parent]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)


GROUPED_SUITE = """
import os
import pytest

def record(request, group):
    with open(os.environ["GROUPS_SEEN"], "a") as f:
        f.write(f"{group} {os.environ['PYTEST_XDIST_WORKER']} {request.node.nodeid}\\n")
""" + "".join(
    f'\n@pytest.mark.xdist_group("{g}")\ndef test_{i}_{g}(request):\n    record(request, "{g}")\n'
    for i in range(6)
    for g in ("a", "b")  # interleaved: a scheduler that ignores groups deals both to both workers
)


def make_test_pytest_options() -> list[str]:
    """The options of ``make test``'s pytest line (the Makefile's own), with 2 workers, every tier."""
    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    (line,) = [x for x in makefile.splitlines() if "-m pytest" in x and x.startswith("\t")]
    return line.split("-m pytest", 1)[1].replace("$(TEST_WORKERS)", "2").replace("$(TEST_SELECT)", "").split()


@pytest.mark.xdist_group("concurrent-campaign")
def test_make_tests_workers_keep_each_xdist_group_on_one_worker(request, tmp_path):
    """``--dist loadgroup`` sends a group's tests to one worker: one session campaign, one SLURM
    cluster, one DDP run. pytest 9.2 broke it without a word (pytest-xdist#1386: each worker built
    them all again); requirements-full.lock pins 9.1.1. A suite of two interleaved groups, run with
    ``make test``'s pytest options on 2 workers, runs each group on one worker, each id carrying
    its group; under ``make test`` this test's own id carries its group too."""
    (tmp_path / "test_grouped.py").write_text(GROUPED_SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the project's settings, nor its conftest
    seen = tmp_path / "seen.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"GROUPS_SEEN": str(seen)}
    cmd = [sys.executable, "-m", "pytest", *make_test_pytest_options(), "-p", "no:cacheprovider", "test_grouped.py"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert res.returncode == 0 and "12 passed" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    rows = [line.split() for line in seen.read_text().splitlines()]
    workers = {g: {w for group, w, _ in rows if group == g} for g in ("a", "b")}
    assert len(rows) == 12 and all(len(w) == 1 for w in workers.values()), rows
    assert all(nodeid.endswith(f"@{group}") for group, _, nodeid in rows), rows
    if getattr(request.config.option, "loadgroup", False):  # an xdist worker of --dist loadgroup
        assert request.node.nodeid.endswith("@concurrent-campaign"), request.node.nodeid


@pytest.mark.xdist_group("concurrent-campaign")  # one worker runs it, no other waits for it
def test_a_campaign_lands_in_mlflow_its_concurrent_runs_lose_no_metric_and_a_rerun_runs_nothing(
    concurrent_campaign, monkeypatch
):
    store, lines = concurrent_campaign["store"], concurrent_campaign["lines"]
    assert concurrent_campaign["ran"] == 3 and not concurrent_campaign["failures"]
    # the three wrote through one local server in front of the SQLite store
    assert any(x.startswith("MLflow tracking server http://127.0.0.1:") and f"store {store}" in x for x in lines)
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("concurrent")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens the training view
    parent = client.search_runs([exp.experiment_id], "tags.`prl.kind` = 'campaign'")[0]
    runs = client.search_runs([exp.experiment_id], "tags.`prl.run_id` != ''")
    assert sorted(r.data.tags["prl.variant"] for r in runs) == ["baseline", "loss=dapo", "sampling=uniform"]
    for run in runs:
        tags, params = run.data.tags, run.data.params
        assert tags["mlflow.parentRunId"] == parent.info.run_id and tags["prl.done"] == "1"
        assert {"prl.seed", "prl.axis", "prl.git_commit", "prl.versions", "prl.code_version"} <= set(tags)
        assert params["train.steps"] == "4" and "algorithm.loss" in params
        assert history_steps(client, run.info.run_id, "val/mean_at_16") == [0, 2, 4]
        hours = [
            m.value
            for m in sorted(client.get_metric_history(run.info.run_id, "compute/gpu_hours"), key=lambda m: m.step)
        ]
        assert hours[0] == 0.0 and hours[1] < hours[2]
        assert history_steps(client, run.info.run_id, "train/loss") == [1, 2, 3, 4]
        arts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"metrics.jsonl", "samples.jsonl", "samples_table.json", "recipe.yaml"} <= arts
        for key in ("train/time/generation_seconds", "train/time/update_seconds", "train/memory/host_peak_rss_gb"):
            assert history_steps(client, run.info.run_id, key) == [1, 2, 3, 4], key
        assert history_steps(client, run.info.run_id, "train/nonfinite_values") == [1, 2, 3, 4]
    assert_ran_together(lines, client, runs)
    monkeypatch.chdir(concurrent_campaign["root"])  # as `make ablation` runs it again: from its folder, on its store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    again: list[str] = []
    assert run_campaign(concurrent_campaign["path"], log=again.append)["ran"] == 0
    assert any("3 done, 0 stopped, 0 to run" in x for x in again), again


def test_a_ray_campaign_without_ray_installed_names_the_set_up_before_anything_runs(store, tmp_path, monkeypatch):
    """ray is in the full set only (requirements-full.lock): a Ray campaign on a runtime-only
    set-up stops with the command that installs it, before any MLflow run or process exists."""
    path = write_campaign(
        tmp_path / "ray.yaml", "no-ray", 4, {"loss": {"key": "algorithm.loss", "values": ["dapo"]}}, backend="ray"
    )
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: import ray fails, find_spec gives None
    with pytest.raises(CampaignError, match="make setup-full"):
        run_campaign(path, log=lambda m: None)
    assert MlflowClient(store).get_experiment_by_name("no-ray") is None
    assert not (tmp_path / "artifacts" / "campaigns" / "no-ray").exists()


@contextlib.contextmanager
def killer(camp_dir: Path, sig: int, at_checkpoint: bool = True):
    """Kill the baseline seed-0 run's train process with ``sig`` once, when its first checkpoint is
    complete (as a preempted job, a segfault or the OOM killer would), or as soon as it runs
    (``at_checkpoint=False``: a run that dies before it saves anything); yields the pids it killed."""
    import threading

    killed: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set() and not killed:
            if not at_checkpoint or list(camp_dir.glob("baseline-*/checkpoints/checkpoint-2/prl_state.json")):
                for p in trainers(f"{camp_dir}/baseline-seed0"):  # this test's run only
                    p.send_signal(sig)
                    killed.append(p.pid)
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield killed
    finally:
        done.set()
        watcher.join(timeout=5)


@pytest.mark.slow
def test_local_scheduler_retries_a_run_that_dies_of_a_signal(store, tmp_path):
    """A segfault in native code leaves no Python traceback: the local scheduler says which signal
    killed the run, shows its Python stack (faulthandler) and starts it again from its checkpoint."""
    path = write_campaign(tmp_path / "segv.yaml", "tiny-segv", 4, {}, max_retries=1)
    said: list[str] = []
    with killer(tmp_path / "artifacts" / "campaigns" / "tiny-segv", signal.SIGSEGV) as killed:
        summary = run_campaign(path, log=said.append)
    assert killed, "the watcher never found the run to kill"
    assert not summary["failures"] and summary["ran"] == 1
    assert any("died of SIGSEGV (signal 11); retry 1/1 resumes from its checkpoint" in m for m in said)
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("tiny-segv")
    (run,) = client.search_runs([exp.experiment_id], "tags.`prl.run_id` != ''")
    assert run.data.tags["prl.done"] == "1"
    assert history_steps(client, run.info.run_id, "val/mean_at_16") == [0, 2, 4]
    log = next((tmp_path / "artifacts" / "campaigns" / "tiny-segv").glob("baseline-*/run.log")).read_text()
    assert "Fatal Python error: Segmentation fault" in log and "resuming from" in log


@pytest.mark.slow
def test_a_run_that_keeps_dying_fails_with_the_signal_named(store, tmp_path):
    path = write_campaign(tmp_path / "segv.yaml", "tiny-segv0", 4, {}, max_retries=0)
    with killer(tmp_path / "artifacts" / "campaigns" / "tiny-segv0", signal.SIGSEGV, at_checkpoint=False) as killed:
        summary = run_campaign(path, log=lambda m: None)
    assert killed, "the watcher never found the run to kill"
    ((spec, why),) = summary["failures"]
    assert spec.variant == "baseline" and why.endswith("(died of SIGSEGV (signal 11) after 0 retries)")


def _stale_server(tmp_path: Path, store: str) -> tuple[Path, int, int]:
    """A local server whose campaign was killed with SIGKILL together with the server's main
    process (``kill -9`` of both, the OOM killer): its record, the main pid and the pid of the
    uvicorn worker left running."""
    from runners.tracking.mlflow_server import server_record

    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from runners.tracking.mlflow_server import local_server\n"
            "with local_server(sys.argv[1], Path(sys.argv[2]), log=lambda m: None):\n"
            "    time.sleep(600)",
            store,
            str(tmp_path / "art-a"),
        ],
        cwd=Path(__file__).resolve().parent.parent,
    )
    record = server_record(store, tmp_path / "art-a")
    deadline = time.time() + 120
    while not record.is_file() and time.time() < deadline:
        time.sleep(0.5)
    info = json.loads(record.read_text())
    wait_healthy(f"http://127.0.0.1:{info['port']}")
    main = psutil.Process(info["pid"])
    (worker,) = main.children()
    main.kill()  # SIGKILL: no finally block runs, no signal reaches the worker
    starter.kill()
    starter.wait()
    assert worker.is_running()  # the fault: the worker outlives its server and its campaign
    return record, info["pid"], worker.pid


def _gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
def test_a_server_left_by_a_killed_campaign_is_stopped_by_the_next(tmp_path, store_template):
    """kill -9 of the process that started a local server and of the server's main process leaves
    its uvicorn worker serving (a child of init); the next server for the same store finds it
    through its record (the token in its environment) and stops it. Before, the record was
    dropped because the main process was dead, and the worker leaked."""
    from runners.tracking.mlflow_server import local_server

    store = empty_store(store_template, tmp_path / "mlflow.db")
    record, stale_pid, worker = _stale_server(tmp_path, store)
    said = []
    with local_server(store, tmp_path / "art-b", log=said.append) as url:
        assert _gone(stale_pid) and _gone(worker)
        assert any("stopping a stale MLflow server" in m and str(worker) in m for m in said)
        assert MlflowClient(url).search_experiments()  # the new one serves the store
    assert not record.exists()  # a clean stop leaves no record


@pytest.mark.slow
def test_make_ui_stops_a_stale_server_before_it_opens_the_store(tmp_path, store_template):
    store = empty_store(store_template, tmp_path / "mlflow.db")
    _, stale_pid, worker = _stale_server(tmp_path, store)
    port = free_port()
    log = tmp_path / "ui.log"
    with log.open("w") as out:
        ui = subprocess.Popen(
            [sys.executable, "-m", "runners", "ui", "--tracking-uri", store, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
        said = log.read_text()
        assert "stopping a stale MLflow server" in said and str(worker) in said
        assert _gone(stale_pid) and _gone(worker)
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=30)


def test_the_ui_of_a_tracking_server_is_the_server_itself():
    """`runners ui` over a store that is a server (MLFLOW_TRACKING_URI of `make tracking-server`):
    one line pointing at it, not `mlflow ui`'s traceback about registry URIs."""
    r = subprocess.run(
        [sys.executable, "-m", "runners", "ui", "--tracking-uri", "http://127.0.0.1:5001"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "http://127.0.0.1:5001 is a tracking server: it serves its own UI" in r.stderr


@pytest.mark.slow
def test_a_local_server_runs_tracking_only(tmp_path, store_template):
    """MLflow's server starts a job runner and ~8 huey consumers (~200 MB each) for GenAI jobs
    unless told not to; a campaign's server is the server and its uvicorn worker, no more.
    ``mlflow server`` starts uvicorn, then (when on) the job runner, then waits on uvicorn: once its
    main process waits, whatever it starts has started, however slow the machine (no fixed sleep)."""
    from runners.tracking.mlflow_server import local_server, server_record

    store = empty_store(store_template, tmp_path / "mlflow.db")
    with local_server(store, tmp_path / "art", log=lambda m: None) as url:
        assert MlflowClient(url).search_experiments()
        server = psutil.Process(json.loads(server_record(store, tmp_path / "art").read_text())["pid"])
        deadline = time.time() + 120
        while Path(f"/proc/{server.pid}/wchan").read_text() != "do_wait":  # Linux: the kernel function it sleeps in
            assert time.time() < deadline, "mlflow server's main process never came to wait on its children"
            time.sleep(0.1)
        children = server.children(recursive=True)
        assert [" ".join(c.cmdline()) for c in children if "uvicorn" not in " ".join(c.cmdline())] == []
        assert len(children) == 1


def test_a_starting_server_says_what_it_is_waiting_for(tmp_path):
    """A first start creates the store's tables (seconds to a minute on a loaded machine): the
    server is announced before the wait and said ready, with the time it took, after it."""
    from runners.tracking.mlflow_server import local_server

    store, lines = f"sqlite:///{tmp_path / 'mlflow.db'}", []
    with local_server(store, tmp_path / "art", log=lines.append) as url:
        assert lines[0] == f"starting an MLflow tracking server on {url} (store {store}) ..."
        assert all(line.startswith("  still starting (") for line in lines[1:-1])
        assert lines[-1].startswith(f"MLflow tracking server {url} (store {store}) ready in ")


# --- resume never splices two runs (#13 item 1) ---------------------------------------------


def _tiny_recipe(steps: int):
    from runners.recipe import load_recipe

    return load_recipe("scalerl", {**TINY, "train.steps": steps, "train.save_every": 2, "eval.every": 2})


def _metric_rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_truncated_newest_checkpoint_is_skipped_for_the_intact_one(tiny_base, tmp_path):
    from runners.rl.train import train

    run = tmp_path / "run"
    whole = train(_tiny_recipe(4), run, log=lambda m: None)
    weights = run / "checkpoints" / "checkpoint-4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a kill mid-write ...
    (run / "done.json").unlink()  # ... before the run could finish
    said = []
    again = train(_tiny_recipe(4), run, log=said.append)
    assert any("skipping checkpoint-4: model.safetensors truncated" in m for m in said)
    assert any(m.endswith("resuming from " + str(run / "checkpoints" / "checkpoint-2")) for m in said)
    assert again["compute/samples"] == whole["compute/samples"] == 4 * 8  # restored counters, not doubled
    assert [r["step"] for r in _metric_rows(run)] == [0, 2, 4]  # every evaluation once


def test_history_without_a_complete_checkpoint_is_not_restarted_into(tiny_base, tmp_path):
    from runners.rl.train import ResumeError, train

    run = tmp_path / "run"
    train(_tiny_recipe(4), run, log=lambda m: None)
    for state in (run / "checkpoints").glob("checkpoint-*/prl_state.json"):
        state.unlink()  # killed between the model file and the state file, both times
    (run / "done.json").unlink()  # so never finished
    with pytest.raises(ResumeError, match=r"metrics up to step 4 but no complete checkpoint.*no prl_state.json"):
        train(_tiny_recipe(4), run, log=lambda m: None)


def test_out_of_device_memory_is_one_line_naming_the_setting_and_the_rerun_resumes(tiny_base, tmp_path):
    """A CUDA out-of-memory error mid-run (raised here at step 3, as the allocator raises it) becomes
    one line naming the estimate's largest part and what to lower; the finished steps survive."""
    import torch

    from runners.recipe import RecipeError
    from runners.rl.train import train

    def oom_at_step_3(metrics: dict, step: int) -> None:
        if step == 3 and "train/loss" in metrics:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.19 GiB total)")

    run = tmp_path / "run"
    with pytest.raises(RecipeError) as e:
        train(_tiny_recipe(4), run, sinks=[oom_at_step_3], log=lambda m: None)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("out of device memory (CUDA out of memory. Tried to allocate 20.00 GiB")
    assert "the estimate's largest part is" in msg and "lower " in msg and "re-running resumes" in msg
    said = []
    train(_tiny_recipe(4), run, log=said.append)
    assert any(m.endswith("resuming from " + str(run / "checkpoints" / "checkpoint-2")) for m in said)
    assert [r["step"] for r in _metric_rows(run)] == [0, 2, 4]


@pytest.mark.slow
def test_a_tracked_run_with_nothing_to_resume_starts_over_as_a_new_mlflow_run(store, tmp_path):
    path = write_campaign(tmp_path / "over.yaml", "start-over", 4, {})
    assert not run_campaign(path, log=lambda m: None)["failures"]
    client = MlflowClient(store)
    exp_id = client.get_experiment_by_name("start-over").experiment_id
    (old,) = client.search_runs([exp_id], "tags.`prl.run_id` != ''")
    client.delete_tag(old.info.run_id, "prl.done")  # an interrupted run ...
    for state in (tmp_path / "artifacts").glob("campaigns/start-over/*/checkpoints/*/prl_state.json"):
        state.unlink()  # ... whose checkpoints were all cut short
    for done in (tmp_path / "artifacts").glob("campaigns/start-over/*/done.json"):
        done.unlink()  # ... and never finished
    assert not run_campaign(path, log=lambda m: None)["failures"]
    (new,) = client.search_runs([exp_id], "tags.`prl.run_id` != ''")
    assert new.info.run_id != old.info.run_id and new.data.tags["prl.done"] == "1"
    assert "prl.report" not in new.data.tags  # runners produce runs; their reports are analysis's
    abandoned = client.get_run(old.info.run_id)
    assert abandoned.data.tags["prl.abandoned_for"] == new.info.run_id and abandoned.info.status == "FAILED"
    assert history_steps(client, new.info.run_id, "val/mean_at_16") == [0, 2, 4]
    assert history_steps(client, new.info.run_id, "train/loss") == [1, 2, 3, 4]
    assert list((tmp_path / "artifacts").glob("campaigns/start-over/*/abandoned-*/metrics.jsonl"))


def test_two_runs_left_with_one_identity_resolve_to_the_finished_else_the_newest(tmp_path, store_template):
    """A kill inside start_over, after the new MLflow run exists and before the old one loses its
    identity, leaves two runs with one identity: the campaign and the fit take the finished one,
    else the newest — never an empty leftover over a finished run, and never an arbitrary one."""
    from runners.tracking import store as st

    client = MlflowClient(empty_store(store_template, tmp_path / "mlflow.db"))
    exp = client.create_experiment("twins")

    def run(start: int, done: bool) -> str:
        tags = {st.RUN_ID: "k"} | ({st.DONE: "1"} if done else {})
        return client.create_run(exp, start_time=start, tags=tags).info.run_id

    run(1_000, done=False)  # the run that was being started over
    finished = run(2_000, done=True)
    leftover = run(3_000, done=False)  # what a later kill left: newest, empty
    assert st.identified_runs(client, exp)["k"].info.run_id == finished
    client.delete_tag(finished, st.DONE)
    assert st.identified_runs(client, exp)["k"].info.run_id == leftover


@pytest.mark.slow
def test_kills_at_random_instants_never_splice_a_run(own_store, session_server, tmp_path):
    """Fault injection: a real campaign killed (SIGKILL) at random instants, around checkpoint saves
    included, then re-run until done: twice the whole tree (campaign, tracking server and trainer),
    once the campaign process alone, whose trainer must go with it (no orphan writes on). The
    finished run must look like an uninterrupted one: one MLflow run, every step once, steps and
    compute monotone, the full step count, and the same completions and tokens at every step as
    the same run never interrupted (its compute counters and its sampler's state were restored)."""
    import random

    rng = random.Random(13)
    path = write_campaign(tmp_path / "faults.yaml", "faults", 12, {})
    cmd = [sys.executable, "-m", "runners", "campaign", str(path)]
    client = MlflowClient(own_store)
    resumable_kills, alone = 0, False
    folders = tmp_path / "artifacts" / "campaigns" / "faults"

    def saved_since(t: float) -> bool:  # this process finished a checkpoint (prl_state.json is written last)
        return any(p.stat().st_mtime > t for p in folders.glob("*/checkpoints/checkpoint-*/prl_state.json"))

    for kill in range(3):  # each kill after a save of its own launch: three resumes of 12 steps
        launched = time.time()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
        # wait until *this* process has trained far enough to save (past imports, server start and
        # resume), then a random instant within the next step or save: the kill lands in training,
        # and the re-run has a checkpoint of this launch's to resume from, however fast the machine
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None and not saved_since(launched):
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.5))
        if proc.poll() is None:
            if kill == 1:  # the campaign process alone: its trainer dies with it (the kernel's doing)
                tree = psutil.Process(proc.pid).children(recursive=True)
                ours = trainers(among=tree)
                proc.kill()
                orphans = psutil.wait_procs(ours, timeout=30)[1]
                for p in tree:  # then the rest of its tree (its tracking server), as the other kills leave it
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.kill()
                assert ours and not orphans, f"orphan trainer(s) still running: {[p.pid for p in orphans]}"
                alone = True
            else:
                _kill_tree(proc.pid)
            saved = [int(p.parent.name.split("-")[1]) for p in folders.glob("*/checkpoints/*/prl_state.json")]
            resumable_kills += max(saved, default=0) < 12  # killed after its last save, it is done, not resumed
        proc.wait()
    summary = run_campaign(path, log=lambda m: None)
    assert not summary["failures"] and resumable_kills >= 2, resumable_kills
    assert alone, "the second launch ended before its campaign process could be killed alone"
    (log,) = folders.glob("*/run.log")
    assert log.read_text().count("resuming from") >= resumable_kills, "a killed run did not resume"
    assert [r["step"] for r in _metric_rows(log.parent)] == list(range(0, 13, 2))  # the folder's own record: once each
    exp_id = client.get_experiment_by_name("faults").experiment_id
    (run,) = client.search_runs([exp_id], "tags.`prl.run_id` != ''")
    rid = run.info.run_id
    assert run.data.tags["prl.done"] == "1"
    assert history_steps(client, rid, "val/mean_at_16") == list(range(0, 13, 2))
    assert history_steps(client, rid, "train/loss") == list(range(1, 13))
    for key in ("compute/samples", "compute/gpu_hours", "compute/tokens"):
        hist = sorted(client.get_metric_history(rid, key), key=lambda m: m.step)
        values = [m.value for m in hist]
        assert values == sorted(values) and len(set(m.step for m in hist)) == len(hist), key
    assert [m.value for m in sorted(client.get_metric_history(rid, "compute/samples"), key=lambda m: m.step)][-1] == 96
    # the same run never interrupted (tracked to the worker's server: its own is not under test here)
    straight = write_campaign(tmp_path / "straight.yaml", "uninterrupted", 12, {})
    assert not run_campaign(straight, tracking_uri=session_server, log=lambda m: None)["failures"]
    other = MlflowClient(session_server)
    exp_whole = other.get_experiment_by_name("uninterrupted").experiment_id
    (whole,) = other.search_runs([exp_whole], "tags.`prl.run_id` != ''")
    for key in ("compute/samples", "compute/tokens"):
        resumed = {m.step: m.value for m in client.get_metric_history(rid, key)}
        assert resumed == {m.step: m.value for m in other.get_metric_history(whole.info.run_id, key)}, key
    again: list[str] = []  # finished: a re-run has nothing to run and starts no tracking server for it
    assert run_campaign(path, log=again.append)["ran"] == 0
    assert any("1 done, 0 stopped, 0 to run" in x for x in again) and not any("tracking server" in x for x in again)


@pytest.mark.parametrize(
    "text,msg",
    [
        ("name: x\nbaseline: scalerl\naxes: {loss: {key: algorithm.loss, values: [dapo,]\n", "not valid YAML"),
        ("", "campaign file is empty"),
        ("- name: x\n", "must be a mapping"),
        ("name: x\nbaseline: scalerl\nseeds: 0\n", r"seeds = 0: expected a list of integers"),
        ("name: x\nbaseline: scalerl\nseeds: [0, 1, 0]\n", "seeds lists 0 twice"),
        ("name: x\nbaseline: scalerl\nparallel: two\n", "parallel = 'two': expected a whole number"),
        ("name: x\nbaseline: scalerl\nseed: [0]\n", "unknown campaign key 'seed'; did you mean 'seeds'"),
        (
            "name: x\nbaseline: scalerl\naxes: {loss: {key: algorithm.loss, values: [dapo, gspo, dapo]}}\n",
            "axis 'loss' values lists 'dapo' twice",
        ),
        # the fit section is checked before any run starts, not when the fit reads it at the end
        ("name: x\nbaseline: scalerl\nfit: {x: compute/flop}\n", "fit.x = 'compute/flop': not a compute axis"),
        ("name: x\nbaseline: scalerl\nfit: {a_grid: '0.9:0.1:0.01'}\n", r"fit.a_grid: need 0 < LO < HI"),
        ("name: x\nbaseline: scalerl\nfit: {a_grid: [0.5, 0.9]}\n", "fit.a_grid = .*expected a string LO:HI:STEP"),
        ("name: x\nbaseline: scalerl\nfit: {margn: 0.05}\n", "unknown key 'fit.margn'.*did you mean 'fit.margin'"),
        # issue 42, item 8: numpy refuses these seeds only once each run has started
        ("name: x\nbaseline: scalerl\nseeds: [-1]\n", r"seeds = \[-1\]: seed -1 is not in \[0, 4294967295\]"),
        ("name: x\nbaseline: scalerl\nbaseline_seeds: [4294967296]\n", r"baseline_seeds = .*seed 4294967296 is not"),
        # item 9: an axis that runs nothing is an error, not silently dropped
        ("name: x\nbaseline: scalerl\naxes: {loss: {key: algorithm.loss, values: []}}\n", "axis 'loss' has no values"),
        (
            "name: x\nbaseline: scalerl\naxes: {loss: {key: algorithm.loss, values: [cispo]}}\n",
            "axis 'loss' lists only the baseline's algorithm.loss = 'cispo', so it runs nothing",
        ),
        # item 11: names stay inside their folders
        ("name: ../../../x\nbaseline: scalerl\n", r"name = '../../../x': a campaign's name must be one path segment"),
        ("name: .x\nbaseline: scalerl\n", r"name = '.x': a campaign's name must be one path segment"),
        (
            "name: x\nbaseline: scalerl\naxes: {../l: {key: algorithm.loss, values: [dapo]}}\n",
            r"axis '../l': an axis's",
        ),
        ("name: x\nbaseline: scalerl\ncontrols: {a/b: {optim.lr: 1.0e-5}}\n", r"control 'a/b': a control's name"),
        (
            "name: x\nbaseline: scalerl\naxes: {data: {key: data.path, values: [../../y.jsonl]}}\n",
            r"axis 'data' value '../../y.jsonl' would put its run folder outside the campaign's folder",
        ),
        # issue 60, item 10: each was accepted silently
        (
            "name: x\nbaseline: scalerl\nseeds: [0]\nname: y\n",
            r"bad.yaml:4: the key 'name' is given twice \(first on line 1\), and YAML would keep only the last one",
        ),
        (
            "name: x\nbaseline: scalerl\noverrides:\n  optim.lr: 1.0e-4\n  optim.lr: 3.0e-4\n",
            r"bad.yaml:5: the key 'optim.lr' is given twice \(first on line 4\)",
        ),
        (
            "name: x\nbaseline: scalerl\nfit: {margin: 0}\n",
            r"fit.margin = 0: expected a difference in pass rate in \(0, 1\), e.g. 0.02 .* with 0 none ever would be",
        ),
        (
            "name: x\nbaseline: scalerl\naxes: {}\n",
            r"axes is empty and there are no controls, so the campaign would run its baseline alone and compare "
            r"nothing: name an axis to leave out \(axes: \{loss: \{key: algorithm.loss, values: \[dapo\]\}\}\) or a",
        ),
        (
            "name: x\nbaseline: scalerl\noverrides: {train.steps: 20}\n",
            r"baseline 'scalerl' with the campaign's overrides: eval.every = 25 is more than train.steps = 20: the run "
            r"would be evaluated at "
            r"step 0 and its end only, never every 25 steps; set eval.every to at most 20 \(e.g. 4\), or raise",
        ),
    ],
)
def test_bad_campaign_files_get_one_clear_line(tmp_path, cli, text, msg):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(CampaignError, match=msg):
        expand(load_campaign(path))  # some need the baseline recipe: its expansion checks them
    r = cli("runners", "campaign", str(path), "--dry-run")
    assert r.returncode != 0 and "Traceback" not in r.stderr and "error" in r.stderr.lower()


def test_a_bad_campaign_file_is_one_line_from_the_shell(tmp_path):
    """The command line itself, in its own process: exit code 2, one error line, no traceback."""
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nbaseline: scalerl\nseed: [0]\n")
    r = subprocess.run(
        [sys.executable, "-m", "runners", "campaign", str(path), "--dry-run"], capture_output=True, text=True
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [
        f"error: {path}: unknown campaign key 'seed'; did you mean 'seeds'? Valid keys: adaptive, axes, backend, "
        "baseline, baseline_seeds, builds, builds_at_once, controls, fit, gpus_per_run, kind, max_retries, name, "
        "overrides, parallel, ray_address, runs_per_gpu, seeds, sizes, slurm"
    ]


def test_a_campaign_name_too_long_for_its_files_is_refused_when_the_file_is_read(tmp_path, monkeypatch, cli):
    """Issue 60, item 6: a 240-character name passed ``--dry-run``, then the campaign ended in a 42-line
    ``OSError: File name too long`` on its lock file (``mlflow.db.NAME.campaign.lock``, over 255
    bytes). Now both are one line when the file is read, and nothing is made: no store, no folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    name = "n" * 240
    path = write_campaign(tmp_path / "long.yaml", name, 2, {})
    for args in ([str(path), "--dry-run"], [str(path)]):
        r = cli("runners", "campaign", *args)
        assert r.returncode == 2 and r.stderr.splitlines() == [
            f"error: {path}: name = '{name}': a campaign's name is 240 characters long; it names folders and files "
            "(255 bytes at most, with what is added to it): shorten it to 100 characters or fewer, e.g. my-campaign"
        ], (args, r.stdout[-2000:], r.stderr[-2000:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.yaml"]  # no mlflow.db, artifacts/ or lock
    ok = write_campaign(tmp_path / "ok.yaml", "n" * 100, 2, {})
    assert cli("runners", "campaign", str(ok), "--dry-run").returncode == 0  # 100 characters are fine


def test_a_listing_whose_reader_stops_early_ends_quietly(tmp_path):
    """`runners campaign … --dry-run | head -1`: the reader closes the pipe; no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # a reader that already stopped: every write meets a closed pipe
    env = os.environ | {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    r = subprocess.run(
        [sys.executable, "-m", "runners", "campaign", "loo-gpu5", "--dry-run"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    os.close(write_end)
    assert r.returncode == 141 and "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr


def test_an_empty_recipe_file_is_refused(tmp_path):
    from runners.recipe import RecipeError, load_recipe

    (tmp_path / "empty.yaml").write_text("\n")
    with pytest.raises(RecipeError, match="recipe file is empty"):
        load_recipe(tmp_path / "empty.yaml")


@pytest.mark.slow
def test_a_metric_write_the_server_refuses_for_a_while_is_retried_until_it_lands(tmp_path, monkeypatch, store_template):
    """Packed runs on one SQLite store can make the tracking server refuse writes for a while
    (loo-gpu3: 13 of 25 runs died of "QueuePool limit ... reached"). The sink retries with
    backoff: here the server is down for the first attempts and comes back on the same port."""
    import threading

    from runners.tracking.mlflow_server import local_server
    from runners.tracking.run import MlflowSink

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's own retries off: ours are tested
    # the sink's first delay, then every second for its whole two minutes: the write lands within a
    # second of the server's return, not at the next step of the backoff (up to 15 s later, idle)
    monkeypatch.setattr(MlflowSink, "RETRY_DELAYS", (1,) * sum(MlflowSink.RETRY_DELAYS))
    store, port = empty_store(store_template, tmp_path / "mlflow.db"), free_port()
    with local_server(store, tmp_path / "art", port=port, log=lambda m: None) as url:
        client = MlflowClient(url)
        run_id = client.create_run(client.create_experiment("retry")).info.run_id
        said: list[str] = []
        sink = MlflowSink(client, run_id, log=said.append)
    back, done = threading.Event(), threading.Event()

    def restart() -> None:
        time.sleep(2)
        with local_server(store, tmp_path / "art", port=port, log=lambda m: None):
            back.set()
            done.wait(120)

    server = threading.Thread(target=restart)
    server.start()
    try:
        sink({"val/mean_at_16": 0.5}, 10)  # server down: refused, retried, then lands
    finally:
        done.set()
        server.join()
    assert back.is_set() and any("retry 1 in 1 s" in m for m in said)
    history = MlflowClient(store).get_metric_history(run_id, "val/mean_at_16")  # read from the store itself
    assert [(m.step, m.value) for m in history] == [(10, 0.5)]


def test_an_evaluation_recorded_but_never_logged_is_backfilled_on_resume(tmp_path, store_template):
    """A run that died after writing an evaluation to metrics.jsonl but before MLflow took it
    (loo-gpu3's baseline/seed0 lost step 40 so): the resumed run's sink logs what MLflow lacks;
    a last line cut short by the kill is skipped, not fatal to the resume."""
    from runners.rl.train import metric_records
    from runners.tracking.run import MlflowSink

    client = MlflowClient(empty_store(store_template, tmp_path / "mlflow.db"))
    run_id = client.create_run(client.create_experiment("backfill")).info.run_id
    client.log_metric(run_id, "val/mean_at_16", 0.48, step=0)
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "val/mean_at_16": v, "compute/samples": 512.0 * s} for s, v in [(0, 0.48), (10, 0.5)]]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 15, "val/mean')  # killed mid-write
    said: list[str] = []
    sink = MlflowSink(client, run_id, log=said.append)
    assert sink.backfill(metric_records(metrics)) == 1 and "steps [10]" in said[0]
    assert [m.step for m in client.get_metric_history(run_id, "val/mean_at_16")] == [0, 10]
    assert [m.step for m in client.get_metric_history(run_id, "compute/samples")] == [10]
    assert sink.backfill(metric_records(metrics)) == 0  # nothing twice


@pytest.mark.slow  # two pico builds at once, then one failing: ~70 s on 2 cores
def test_builds_at_once_builds_distinct_base_models_concurrently_and_names_a_failed_one(tmp_path, monkeypatch):
    from runners.campaign.backends.local import build_base_models

    monkeypatch.setenv("PRL_CACHE", str(tmp_path / "cache"))
    path = write_campaign(tmp_path / "b.yaml", "builds-at-once", 2, {}, builds=2, builds_at_once=2)
    doc = json.loads(path.read_text())
    doc["overrides"]["model.size"] = "pico"
    path.write_text(json.dumps(doc))
    camp = load_campaign(path)
    assert camp.backend_settings.builds_at_once == 2
    specs = expand(camp)
    bases = {s.recipe.base_model() for s in specs}
    assert len(bases) == 2  # two builds, two base models
    lines: list[str] = []
    build_base_models(specs, tmp_path / "root", None, lines.append, at_once=2)
    assert all((b / "build_info.json").is_file() for b in bases)
    starts = [i for i, x in enumerate(lines) if x.startswith("building base model")]
    ready = [i for i, x in enumerate(lines) if "base model ready" in x]
    assert len(starts) == 2 and max(starts) < min(ready), lines  # both were building before either ended
    lines.clear()
    build_base_models(specs, tmp_path / "root", None, lines.append, at_once=2)
    assert lines == []  # built: nothing to do again

    first, second = dict.fromkeys(s.recipe.base_model() for s in specs)  # in the campaign's order
    for b in bases:
        shutil.rmtree(b)
    first.write_text("not a folder")  # where its weights go, a file: its process fails
    with pytest.raises(CampaignError, match=f"building base model {first.name} failed"):
        build_base_models(specs, tmp_path / "root", None, lines.append, at_once=1)
    assert not second.exists()  # one at a time: once one failed, the next is not started
    with pytest.raises(CampaignError, match=f"building base model {first.name} failed"):
        build_base_models(specs, tmp_path / "root", None, lines.append, at_once=2)
    assert (second / "build_info.json").is_file()  # at once: the other one in flight still ends built

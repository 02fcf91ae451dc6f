"""A campaign's tracking server killed with ``kill -9`` mid-campaign (issue 42, item 1): before, the
trainer blocked silently in MLflow's retries (about 4 min a call, 8 calls), the run failed after
about 39 min and the campaign died with a 135-line traceback. Now the campaign starts the server
again on the same store and port within seconds and the run carries on; where that cannot be
done, it stops its runs and says why in one line."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from runners.tracking import server_processes
from runners.tracking.mlflow_server import server_record
from runners.tracking.run import http_limits, request_error
from tests.campaigns import history_steps, trainers, write_campaign

REPO = Path(__file__).resolve().parent.parent
STEPS = 6  # a checkpoint and an evaluation every 2: the kill lands after the first, 4 steps to go


@contextlib.contextmanager
def campaign(tmp_path: Path, name: str) -> Iterator[tuple[subprocess.Popen, Path, Path]]:
    """``python -m runners campaign`` of a tiny one-run campaign (the test's store, from its folder),
    as a user runs it; yields it once its run has saved its first checkpoint, with its stdout and
    stderr files. Whatever is left of its process tree is killed at the end."""
    path = write_campaign(tmp_path / f"{name}.yaml", name, STEPS, {})
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runners", "campaign", str(path)], stdout=o, stderr=e, env=os.environ.copy()
        )
    tree: list[psutil.Process] = []
    try:
        deadline = time.time() + 300
        saved = tmp_path / "artifacts" / "campaigns" / name
        while not list(saved.glob("*/checkpoints/checkpoint-2/prl_state.json")):
            assert proc.poll() is None, out.read_text() + err.read_text()
            assert time.time() < deadline, "the run saved no checkpoint within 300 s: " + out.read_text()
            time.sleep(0.2)
        tree = psutil.Process(proc.pid).children(recursive=True)
        yield proc, out, err
    finally:
        for p in [*tree, psutil.Process(proc.pid)] if proc.poll() is None else tree:
            with contextlib.suppress(psutil.Error):
                p.kill()
        proc.wait()


def kill_server(store: str, artifacts: Path) -> tuple[int, list[int]]:
    """``kill -9`` of the campaign's MLflow server, its main process and its uvicorn worker; its port
    and the pids killed."""
    info = json.loads(server_record(store, artifacts).read_text())
    procs = server_processes.processes(info["token"])
    assert len(procs) == 2 and info["pid"] in [p.pid for p in procs], procs  # main + worker
    for p in procs:
        p.send_signal(signal.SIGKILL)
    return info["port"], [p.pid for p in procs]


def wait_for(path: Path, text: str, proc: subprocess.Popen, seconds: float) -> bool:
    """Whether ``text`` shows in ``path`` within ``seconds`` (False at once if ``proc`` ended without it)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if text in path.read_text():
            return True
        if proc.poll() is not None:
            return text in path.read_text()
        time.sleep(0.2)
    return False


def the_run(store: str, name: str):
    client = MlflowClient(store)
    exp = client.get_experiment_by_name(name)
    (run,) = client.search_runs([exp.experiment_id], "tags.`prl.run_id` != ''")
    (parent,) = client.search_runs([exp.experiment_id], "tags.`prl.kind` = 'campaign'")
    return client, run, parent


@pytest.mark.slow
def test_a_killed_campaign_server_is_started_again_and_the_run_carries_on(own_store, tmp_path):
    with campaign(tmp_path, "server-kill") as (proc, out, err):
        (trainer,) = trainers(str(tmp_path))
        assert {k: trainer.environ().get(k) for k in http_limits()} == http_limits()  # its calls give up in ~30 s
        port, killed = kill_server(own_store, tmp_path / "artifacts/campaigns/server-kill/mlartifacts")
        t_kill = time.time()
        assert wait_for(out, "tracking server back on", proc, 60), out.read_text() + err.read_text()
        back = time.time() - t_kill
        assert proc.wait(timeout=300) == 0, out.read_text() + err.read_text()
    said = out.read_text()
    assert "died; starting it again on the same store and port" in said and back < 60, said
    assert f"tracking server back on http://127.0.0.1:{port} (pid " in said  # the same port: the runs' URL holds
    assert all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in killed)
    assert "campaign finished: 1 run(s) executed, 0 failed" in said and "Traceback" not in err.read_text()
    client, run, parent = the_run(own_store, "server-kill")
    assert run.data.tags["prl.done"] == "1" and parent.info.status == "FINISHED"
    assert history_steps(client, run.info.run_id, "val/mean_at_16") == list(range(0, STEPS + 1, 2))  # once each
    assert history_steps(client, run.info.run_id, "train/loss") == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_a_campaign_server_that_cannot_be_started_again_stops_the_runs_in_one_line(own_store, tmp_path):
    """The port its runs write to is taken the moment the server dies: the campaign cannot serve
    them again there, so it stops them and ends with one line naming the holder; a re-run resumes."""
    name, artifacts = "server-lost", tmp_path / "artifacts/campaigns/server-lost/mlartifacts"
    with campaign(tmp_path, name) as (proc, out, err), socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        port, _ = kill_server(own_store, artifacts)
        t_kill = time.time()
        while True:  # the port is free once the kernel has closed the killed server's socket
            try:
                squatter.bind(("127.0.0.1", port))
                break
            except OSError:
                assert time.time() < t_kill + 5
                time.sleep(0.01)
        squatter.listen()
        ours = trainers(str(tmp_path))
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the campaign did not end within 60 s of its server's death: " + out.read_text())
        assert time.time() - t_kill < 60
    lines = err.read_text().strip().splitlines()
    assert code == 2 and len(lines) == 1, err.read_text()
    (line,) = lines
    assert line.startswith("error: the campaign's MLflow tracking server (pid ") and "died and cannot be" in line
    assert f"port {port}, which its runs write to, is now held by pid {os.getpid()} (" in line, line
    assert f"stop it (kill {os.getpid()}), then run the campaign again" in line, line
    assert ours and not [p for p in ours if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # stopped
    client, run, parent = the_run(own_store, name)
    assert parent.info.status == "FAILED" and "prl.done" not in run.data.tags
    again = subprocess.run(
        [sys.executable, "-m", "runners", "campaign", str(tmp_path / f"{name}.yaml")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming from" in again.stdout
    client, run, _ = the_run(own_store, name)
    assert run.data.tags["prl.done"] == "1"
    assert history_steps(client, run.info.run_id, "val/mean_at_16") == list(range(0, STEPS + 1, 2))


def test_a_write_to_a_server_that_is_gone_says_its_cause_on_the_console(tmp_path, store_template, monkeypatch):
    """The trainer's line for a write its tracking server did not take names the request and its
    cause (urllib3's chain, cut at 160 characters, lost it) and is one the campaign echoes to its
    console (it was in run.log only)."""
    from mlflow.exceptions import MlflowException

    from runners.campaign.backends.local import PROGRESS_MARKS
    from runners.tracking.run import MlflowSink
    from tests.conftest import empty_store

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's own retries off: the sink's are said
    monkeypatch.setattr(MlflowSink, "RETRY_DELAYS", (0, 0))
    client = MlflowClient(empty_store(store_template, tmp_path / "mlflow.db"))
    run_id = client.create_run(client.create_experiment("gone")).info.run_id
    said: list[str] = []
    sink = MlflowSink(client, run_id, log=said.append)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening: the port of a server that is gone
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        sink.client = MlflowClient(url)
        with pytest.raises(MlflowException) as e:
            sink({"val/mean_at_16": 0.5}, 2)
    cause = f"API request to {url}/api/2.0/mlflow/runs/log-batch failed: [Errno 111] Connection refused"
    assert request_error(e.value) == cause
    assert said == [f"tracking server refused a write ({cause}); retry {n} in 0 s" for n in (1, 2)]
    assert all(any(mark in line for mark in PROGRESS_MARKS) for line in said)  # echoed on the console

"""A Ray campaign on a cluster of two nodes, both on this machine (``ray start --head`` and ``ray
start --address``, one CPU each): its runs land on both nodes; a run whose process is killed by a
signal (as a preempted job's is) is retried by Ray, and a run whose node is lost mid-run resumes
on the head node, each into its own MLflow run with every step once in its history."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from runners.campaign.runs import run_campaign
from runners.tracking.server_processes import free_port
from tests.campaigns import history_steps, trainers, write_campaign

RAY = str(Path(sys.executable).parent / "ray")


def _launch(*args: str, log: Path) -> subprocess.Popen:
    """``ray start ARGS --block``: one node, its processes in a session of their own."""
    cmd = [RAY, "start", *args, "--num-cpus=1", "--num-gpus=0", "--object-store-memory=100000000"]
    cmd += ["--disable-usage-stats", "--block"]
    env = {
        **os.environ,
        "RAY_raylet_start_wait_time_s": "300",  # Ray's 60 s is short on a loaded machine
        "RAY_gcs_server_port_wait_time_s": "300",  # a node started beside its head waits for the head's GCS
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",  # stopped at the end: no 30 s drain (SIGTERM), idle
    }
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _ray_node(*args: str, log: Path, launched: subprocess.Popen | None = None, tries: int = 3) -> subprocess.Popen:
    """A node (``launched``, or one launched here) once it says it started. Ray gives a node's agent
    30 s to start (a fixed wait), which a loaded machine can miss: then the node is stopped and
    started again. A node stopped by SIGTERM shuts down at once instead of draining for up to 30 s,
    which the test's nodes spent idle at its end."""
    for _ in range(tries):
        proc = launched or _launch(*args, log=log)
        launched = None
        deadline = time.time() + 300
        while proc.poll() is None and time.time() < deadline and "Ray runtime started" not in log.read_text():
            time.sleep(1.0)
        if proc.poll() is None and "Ray runtime started" in log.read_text():
            return proc
        _stop(proc)
    raise AssertionError(f"ray start {' '.join(args)} failed {tries} times:\n{log.read_text()[-2000:]}")


def _stop(*nodes: subprocess.Popen) -> None:
    """Stop nodes, all at once: each one's ``ray start`` and every process of its session (never
    `ray stop`, which would stop every Ray on this machine)."""
    for node in nodes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGTERM)
    deadline = time.time() + 30
    for node in nodes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.wait(timeout=max(0.1, deadline - time.time()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
        node.wait()


@contextlib.contextmanager
def two_nodes(tmp: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """A head node and a worker node (resource ``worker``) on this machine; the driver connected.
    The worker is launched beside the head (their start-ups overlap) and joins it once its GCS answers."""
    import ray

    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    nodes: list[subprocess.Popen] = []
    try:
        port = free_port()
        address = f"127.0.0.1:{port}"
        head = ["--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp_dir}"]
        worker = [f"--address={address}", '--resources={"worker": 1}']
        nodes += [_launch(*head, log=tmp / "ray-head.log"), _launch(*worker, log=tmp / "ray-worker.log")]
        nodes[0] = _ray_node(*head, log=tmp / "ray-head.log", launched=nodes[0])
        nodes[1] = _ray_node(*worker, log=tmp / "ray-worker.log", launched=nodes[1])
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
        deadline = time.time() + 120
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            assert time.time() < deadline, ray.nodes()
            time.sleep(1.0)
        yield address, nodes[1]
    finally:
        ray.shutdown()
        _stop(*reversed(nodes))
        shutil.rmtree(temp_dir, ignore_errors=True)


def _placements(run_dir: Path) -> list[str]:
    """The Ray node id of each attempt of a run, from its log."""
    lines = (run_dir / "run.log").read_text().splitlines() if (run_dir / "run.log").is_file() else []
    return [x.split()[3] for x in lines if x.startswith("[placement] ray node ")]


@pytest.mark.xdist_group("ray")
@pytest.mark.slow
def test_a_ray_campaign_lands_on_two_nodes_survives_a_preempted_run_and_losing_a_node(store, tmp_path, monkeypatch):
    import ray

    # one mode for the nodes and the driver: Ray turns token auth on by itself where ~/.ray/auth_token
    # exists (a local ray.init() writes one), for a head node but not for a node joining it, and a
    # driver reads the mode once per process
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")

    path = write_campaign(
        tmp_path / "ray2.yaml",
        "tiny-ray-nodes",
        4,
        {"loss": {"key": "algorithm.loss", "values": ["cispo", "dapo"]}},
        backend="ray",
        max_retries=2,
    )
    camp_dir = tmp_path / "artifacts" / "campaigns" / "tiny-ray-nodes"
    killed: list[str] = []  # the run whose node was lost, once
    preempted: list[str] = []  # the run whose process was killed by a signal, once
    orphans: list[psutil.Process] = []  # its processes still alive a minute after
    with two_nodes(tmp_path) as (address, worker):
        doc = json.loads(path.read_text())
        path.write_text(json.dumps({**doc, "ray_address": address}))
        (worker_id,) = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "worker" in n["Resources"]]
        (head_id,) = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "worker" not in n["Resources"]]
        stop = threading.Event()

        def preempt_one_and_lose_the_worker_mid_run() -> None:
            while not stop.is_set() and not (killed and preempted):
                for run_dir in camp_dir.glob("*-seed0-*"):
                    first = _placements(run_dir)[:1]
                    if not (run_dir / "checkpoints" / "checkpoint-2" / "prl_state.json").is_file():
                        continue
                    if first == [head_id] and not preempted:  # its trainer killed alone, as a preempted job's
                        for p in trainers(str(run_dir)):
                            with contextlib.suppress(psutil.NoSuchProcess):
                                p.kill()
                                preempted.append(run_dir.name)
                    if first == [worker_id] and not killed:
                        runs = [p for p in psutil.process_iter(["cmdline"]) if run_dir.name in str(p.info["cmdline"])]
                        ray_procs = [p for p in psutil.Process(worker.pid).children(recursive=True) if p not in runs]
                        for proc in ray_procs:  # the node is gone: every Ray process of it, as `ray stop --force`
                            with contextlib.suppress(psutil.NoSuchProcess):
                                proc.kill()
                        killed.append(run_dir.name)
                        orphans.extend(psutil.wait_procs(runs, timeout=60)[1])
                time.sleep(0.2)

        watcher = threading.Thread(target=preempt_one_and_lose_the_worker_mid_run, daemon=True)
        watcher.start()
        try:
            said: list[str] = []
            summary = run_campaign(path, log=said.append)
        finally:
            stop.set()
            watcher.join(timeout=5)
    assert killed, "no run landed on the worker node, or it finished before its first checkpoint"
    assert preempted, "no run landed on the head node, or it finished before its first checkpoint"
    assert not orphans, f"the lost node's run went on writing: {orphans}"
    assert not summary["failures"] and summary["ran"] == 2, "\n".join(said)
    attempts = {run_dir.name: _placements(run_dir) for run_dir in camp_dir.glob("*-seed0-*")}
    assert sorted(p[0] for p in attempts.values()) == sorted([head_id, worker_id])  # the runs landed on both nodes
    assert attempts[killed[0]] == [worker_id, head_id]  # the lost node's run ran again on the head
    assert attempts[preempted[0]] == [head_id, head_id]  # retried by Ray where a CPU was free: the head's own
    for name in (killed[0], preempted[0]):
        assert "resuming from" in (camp_dir / name / "run.log").read_text(), name

    client = MlflowClient(store)
    exp = client.get_experiment_by_name("tiny-ray-nodes")
    children = client.search_runs([exp.experiment_id], "tags.`prl.run_id` != ''")
    assert len(children) == 2
    for run in children:
        assert run.data.tags["prl.done"] == "1"
        assert history_steps(client, run.info.run_id, "val/mean_at_16") == [0, 2, 4]  # every step once
        assert history_steps(client, run.info.run_id, "train/loss") == [1, 2, 3, 4]
        assert run.data.tags["prl.placement"].startswith(f"ray node {head_id}")  # where its last attempt ran

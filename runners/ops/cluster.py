"""Campaign backend on a Ray cluster: one Ray task per run, scheduled by Ray on its nodes' CPUs/GPUs.

Each task runs the same command as the local scheduler (``python -m runners train recipe.yaml``)
with the run's MLflow run id, so a run that is preempted (its process killed by a signal, or its
node lost) is retried by Ray and resumes from its last checkpoint into the same MLflow run; the
run's process dies with the Ray worker that started it (``locks.child_env``), so a lost node leaves no process writing
beside the retry. Each attempt records its node (``prl.placement`` tag, a line in ``run.log``).
Run folders must be on storage every node sees (a shared filesystem), and the tracking URI must be
reachable from every node (``make tracking-server`` on the head node, or any MLflow server).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from runners.ops.campaign import RunSpec
from runners.ops.local import Launch, tail
from runners.ops.locks import child_env


def note_placement(env: dict[str, str], log_path: str, where: str) -> None:
    """Say where this attempt of a run runs: a line in its log and its MLflow tag ``prl.placement``."""
    with open(log_path, "a") as f:
        f.write(f"[placement] {where}\n")
    if env.get("MLFLOW_RUN_ID"):
        from mlflow.tracking import MlflowClient

        from runners.ops import store

        MlflowClient(env["MLFLOW_TRACKING_URI"]).set_tag(env["MLFLOW_RUN_ID"], store.PLACEMENT, where)


class Preempted(RuntimeError):
    """The run's process was killed by a signal: retry it (it resumes from its checkpoint)."""


def _run_task(cmd: list[str], env: dict[str, str], cwd: str, log_path: str) -> tuple[int, str]:
    import ray

    note_placement(env, log_path, f"ray node {ray.get_runtime_context().get_node_id()} on {socket.gethostname()}")
    with open(log_path, "a") as logf:
        env = {**os.environ, **env, **child_env()}  # the run dies with this worker
        proc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    if proc.returncode < 0:
        raise Preempted(f"run process killed by signal {-proc.returncode}")
    return proc.returncode, tail(Path(log_path))


def run_on_ray(
    todo: list[RunSpec],
    prepare: Callable[[RunSpec], Launch],
    *,
    address: str | None,
    gpus_per_run: int,
    max_retries: int,
    log: Callable[[str], None],
    monitor: Callable[[], None] | None = None,
) -> list[tuple[RunSpec, str]]:
    """Submit every run (``prepare(spec)`` gives its MLflow run and command) as a Ray task and wait;
    returns ``(spec, log tail)`` failures, as ``runners.ops.local.run_local`` does."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    res = ray.cluster_resources()
    log(f"Ray cluster: {res.get('CPU', 0):.0f} CPU, {res.get('GPU', 0):.0f} GPU")
    gpus = gpus_per_run if res.get("GPU", 0) > 0 else 0
    task = ray.remote(_run_task).options(
        num_cpus=1, num_gpus=gpus, max_retries=max_retries, retry_exceptions=[Preempted]
    )
    pending = {}
    for spec in todo:
        launch = prepare(spec)
        cmd = [*launch.cmd, "--gpus", str(gpus)] if gpus > 1 else launch.cmd
        ref = task.remote(cmd, launch.env, str(Path.cwd()), str(launch.run_dir / "run.log"))
        pending[ref] = spec
    failures, t0, done = [], time.perf_counter(), 0
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=5.0)
        if monitor is not None:
            monitor()
        if not ready:
            continue
        spec = pending.pop(ready[0])
        done += 1
        try:
            code, tail = ray.get(ready[0])
        except Exception as e:  # noqa: BLE001 - retries exhausted, or the task could not run
            code, tail = -1, f"{type(e).__name__}: {e}"
        elapsed = time.perf_counter() - t0
        if code == 0:
            log(f"[{done}/{len(todo)}] done  {spec.variant} seed {spec.seed}  ({elapsed:.0f} s so far, Ray)")
        else:
            failures.append((spec, tail))
            log(f"[{done}/{len(todo)}] FAILED {spec.variant} seed {spec.seed}: {tail.splitlines()[-1:]}")
    return failures

"""The Ray backend (``backend: ray``): one Ray task per run, scheduled by Ray on its nodes' CPUs/GPUs;
its settings are ``RaySettings`` (``ray_address``, ``gpus_per_run``, ``max_retries``).

Each task runs the same command as the local scheduler (``python -m runners train recipe.yaml``)
with the run's MLflow run id, so a run that is preempted (its process killed by a signal, or its
node lost) is retried by Ray and resumes from its last checkpoint into the same MLflow run; the
run's process dies with the Ray worker that started it (``parent_death.child_env``), so a lost node
leaves no process writing beside the retry. Each attempt records its node (``prl.placement`` tag, a
line in ``run.log``). Run folders must be on storage every node sees (a shared filesystem), and the tracking URI must be
reachable from every node (``make tracking-server`` on the head node, or any MLflow server).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from runners.campaign.backends import Backend, Ended, Launch, note_placement, register, tail, with_gpus
from runners.campaign.spec import BackendSettings, CampaignError, RunSpec, whole_numbers
from runners.parent_death import child_env


@dataclass(kw_only=True)
class RaySettings(BackendSettings):
    """The Ray backend's campaign keys: which cluster, and each run's GPUs."""

    keys: ClassVar[tuple[str, ...]] = ("ray_address", "gpus_per_run", "max_retries")
    ray_address: str | None = None  # None: start a local Ray instance; "auto" or ray://host:port: join a cluster
    gpus_per_run: int = 1  # on a cluster with GPUs; > 1: DDP through accelerate

    @classmethod
    def parse(cls, data: dict[str, Any]) -> RaySettings:
        address = data.get("ray_address")
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise CampaignError(
                f"ray_address = {address!r}: expected auto, HEAD:6379 or ray://HOST:10001 (absent: a local Ray)"
            )
        return cls(ray_address=address, **whole_numbers(data, ["gpus_per_run", "max_retries"]))


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


@register
class RayBackend(Backend):
    """Every run submitted at once as a Ray task; Ray retries a preempted run or a lost node's."""

    name = "ray"
    settings_class = RaySettings

    def check(self) -> None:
        if importlib.util.find_spec("ray") is None:
            raise CampaignError(
                f"campaign {self.camp.name} runs on Ray, which is not installed here: `make setup-full` "
                "(or pip install -r requirements.lock -r requirements-full.lock) installs the pinned ray"
            )

    def start(self, todo: list[RunSpec], root: Path) -> None:
        import ray

        from runners.campaign.backends.local import build_base_models

        # each base model built once, here: the campaign records and logs it, and a node whose cache lacks
        # it takes it from the store (``runners.tracking.basemodels``) rather than building weights of its own
        build_base_models(todo, root, None, self.log)

        if not ray.is_initialized():
            ray.init(address=self.settings.ray_address, include_dashboard=False, log_to_driver=False)
        res = ray.cluster_resources()
        self.log(f"Ray cluster: {res.get('CPU', 0):.0f} CPU, {res.get('GPU', 0):.0f} GPU")
        self.gpus = self.settings.gpus_per_run if res.get("GPU", 0) > 0 else 0
        self.task = ray.remote(_run_task).options(
            num_cpus=1, num_gpus=self.gpus, max_retries=self.settings.max_retries, retry_exceptions=[Preempted]
        )
        self.pending: dict[Any, RunSpec] = {}

    def submit(self, launch: Launch) -> None:
        cmd = with_gpus(launch.cmd, self.gpus)
        ref = self.task.remote(cmd, launch.env, str(Path.cwd()), str(launch.run_dir / "run.log"))
        self.pending[ref] = launch.spec

    def placement(self, launch: Launch) -> str:
        return f" as a Ray task (1 CPU, {self.gpus} GPU)"

    def poll(self) -> list[Ended]:
        import ray

        ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=5.0) if self.pending else ([], [])
        ended = []
        for ref in ready:
            spec = self.pending.pop(ref)
            try:
                code, why = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - retries exhausted, or the task could not run
                code, why = -1, f"{type(e).__name__}: {e}"
            ended.append(Ended(spec, code == 0, why))
        return ended

    def cancel(self) -> None:
        import ray

        for ref in getattr(self, "pending", {}):  # force: the worker dies, and its run with it (``child_env``)
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)

"""The local backend (``backend: local``, the default): a campaign's runs as processes on this
machine, as many at once as it has slots (``parallel`` on CPU, ``runs_per_gpu`` per GPU on every
visible GPU, ``gpus_per_run`` GPUs each), with each run's progress echoed to the console as it
happens. Its settings are ``LocalSettings``; the interface is ``runners.campaign.backends.Backend``.

A run that dies of a signal (a segfault in native code, the kernel's OOM killer) is started again
up to ``max_retries`` times: it resumes from its checkpoint. A Python error is not retried (it would
fail the same way); every run has Python's faulthandler on, so a native crash leaves its stack in
``run.log``. Every process it starts dies with it (``parent_death.child_env``): a campaign killed with
``kill -9`` leaves no trainer writing in a run folder that its next run would resume.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, ClassVar

from runners.campaign.backends import Backend, Ended, Launch, register, tail, with_gpus
from runners.campaign.spec import BackendSettings, CampaignError, RunSpec, whole_numbers
from runners.parent_death import child_env
from runners.threads import share_cores, usable_cores

PROGRESS_MARKS = (
    "] step ",
    "building base model",
    "SFT",
    "base model ready",
    "resuming",
    "stopped at step",
    "done in ",
    "tracking server",  # a write the tracking server did not take, and why (``tracking.run.MlflowSink``)
)


@dataclass(kw_only=True)
class LocalSettings(BackendSettings):
    """The local backend's campaign keys: how many runs at once, and each run's GPUs."""

    keys: ClassVar[tuple[str, ...]] = ("parallel", "runs_per_gpu", "gpus_per_run", "max_retries", "builds_at_once")
    parallel: int = 1  # concurrent runs on CPU
    runs_per_gpu: int = 1
    gpus_per_run: int = 1  # > 1: each run spans this many GPUs through accelerate (DDP)
    builds_at_once: int = 1  # distinct base models built concurrently before the runs (> 1 pays under CUDA MPS)

    @classmethod
    def parse(cls, data: dict) -> LocalSettings:
        return cls(**whole_numbers(data, list(cls.keys)))


@dataclass
class _Running:
    proc: subprocess.Popen
    launch: Launch
    device: str | None
    logf: IO[str]
    offset: int = 0
    partial: str = field(default="")


def run_folder(root: Path, spec: RunSpec) -> Path:
    return (root / f"{spec.variant.replace('=', '-')}-seed{spec.seed}-{spec.run_key}").resolve()


def command(spec: RunSpec, run_id: str, uri: str, root: Path) -> Launch:
    """The run's folder (recipe written) and its ``python -m runners train`` command, whose MLflow
    calls give up in about 60 s (``tracking.run.HTTP_LIMITS``)."""
    from runners.tracking.run import http_limits

    rdir = run_folder(root, spec)
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "recipe.yaml").write_text(spec.recipe.to_yaml())
    cmd = [sys.executable, "-m", "runners", "train", str(rdir / "recipe.yaml"), "--run-dir", str(rdir)]
    return Launch(spec, cmd, {"MLFLOW_TRACKING_URI": uri, "MLFLOW_RUN_ID": run_id, **http_limits()}, rdir)


def devices() -> list[str | None]:
    """Visible CUDA devices as CUDA_VISIBLE_DEVICES values, or ``[None]`` (CPU). A torch built for
    neither CUDA nor ROCm is not imported to say so (2 s of CPU in every campaign's process)."""
    if _cpu_only_torch():
        return [None]
    try:
        import torch

        n = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch CUDA: CPU
        n = 0
    return visible_ids(os.environ.get("CUDA_VISIBLE_DEVICES"), n) or [None]


def visible_ids(setting: str | None, count: int) -> list[str]:
    """The CUDA_VISIBLE_DEVICES value that names each of the ``count`` GPUs this process sees: the
    entries of its own setting, in order (indices or UUIDs), else ``0 .. count-1``. A campaign started
    with ``CUDA_VISIBLE_DEVICES=1`` then runs on GPU 1; before, its runs were given ``0``, GPU 0."""
    if setting is None:
        return [str(i) for i in range(count)]
    return [e.strip() for e in setting.split(",") if e.strip()][:count]


def _cpu_only_torch() -> bool:
    """Whether the installed torch was built without CUDA and ROCm (``cuda`` and ``hip`` None in its
    version.py), read without importing it; False where that cannot be read (torch is asked then)."""
    import importlib.util
    import re

    try:
        text = (Path(importlib.util.find_spec("torch").origin).parent / "version.py").read_text()
    except (AttributeError, ImportError, OSError, TypeError, ValueError):
        return False
    builds = dict(re.findall(r"^(cuda|hip)\b[^=\n]*=\s*(\S+)", text, re.M))
    return builds == {"cuda": "None", "hip": "None"}


def slots(settings: LocalSettings, where: Path) -> list[str | None]:
    """One slot per concurrent run: GPUs x runs_per_gpu, or ``parallel`` CPU slots."""
    devs = devices()
    if devs == [None]:
        return [None] * max(1, settings.parallel)
    n = max(1, settings.gpus_per_run)
    if n > len(devs):
        raise CampaignError(f"{where}: gpus_per_run = {n}, but only {len(devs)} GPU(s) are visible")
    groups = [",".join(devs[i : i + n]) for i in range(0, len(devs) - n + 1, n)]  # "0,1", "2,3", ...
    return [g for g in groups for _ in range(max(1, settings.runs_per_gpu))]


def build_base_models(
    todo: list[RunSpec], root: Path, device: str | None, log: Callable[[str], None], at_once: int = 1
) -> None:
    """Build each distinct embedded base model once, before runs that share it start, ``at_once`` at a
    time (the campaign's ``builds_at_once``), each process given an equal share of the cores.

    Packed runs that each found the cache empty would all build it at once (measured on an H200:
    416-550 s each for 4 concurrent builds against 118-146 s for one alone). Distinct builds at once
    gain nothing where the GPU time-slices between processes, and overlap under CUDA MPS
    (docs/operations.md). Once a build fails no other starts; the campaign stops after those in flight
    end, naming every one that failed.
    """
    users: dict[Path, list[RunSpec]] = {}
    for spec in todo:
        if (base := spec.recipe.base_model()) is not None:
            users.setdefault(base, []).append(spec)
    pending = [(path, specs) for path, specs in users.items() if not (path / "build_info.json").is_file()]
    if not pending:
        return
    root.mkdir(parents=True, exist_ok=True)
    at_once = max(1, min(at_once, len(pending)))
    threads = max(1, cores() // at_once)
    failing = threading.Event()  # once one fails, builds not yet started are not started

    def build(path: Path, specs: list[RunSpec]) -> str | None:
        """One build's process, its progress lines logged; the reason it failed, else None."""
        if failing.is_set():
            return None
        log(f"building base model {path.name} once for {len(specs)} run(s)" + (f" on cuda:{device}" if device else ""))
        recipe_file = root / f"base-{path.name}.yaml"
        recipe_file.write_text(specs[0].recipe.to_yaml())
        env = {**os.environ, **child_env()}
        share_cores(env, threads)  # each build its share of the cores, waiting passively
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device.split(",")[0]
        proc = subprocess.Popen(
            [sys.executable, "-m", "runners", "base-model", str(recipe_file)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        out = []
        for line in proc.stdout:  # type: ignore[union-attr]
            out.append(line.rstrip())
            if any(m in line for m in ("building base model", "base model ready", "SFT")):
                log("  " + (f"[{path.name}] " if at_once > 1 else "") + line.rstrip())
        if proc.wait() == 0:
            return None
        failing.set()
        return f"building base model {path.name} failed: {(out or ['no output'])[-1]}"

    with ThreadPoolExecutor(max_workers=at_once) as pool:
        failed = [f for f in pool.map(lambda job: build(*job), pending) if f is not None]
    if failed:  # every run of those would fail the same way: say why once
        raise CampaignError("; ".join(failed))


@register
class LocalBackend(Backend):
    """Runs as processes on this machine, one per slot (``slots``)."""

    name = "local"
    settings_class = LocalSettings

    def check(self) -> None:
        """Nothing to install; runs that span GPUs need as many visible (``slots``)."""
        if self.settings.gpus_per_run > 1:
            slots(self.settings, self.camp.path)

    def start(self, todo: list[RunSpec], root: Path) -> None:
        self.free = slots(self.settings, self.camp.path)
        self.threads = max(1, cores() // max(1, len(self.free)))
        self.running: list[_Running] = []
        self.retried: dict[str, int] = {}
        build_base_models(todo, root, self.free[0], self.log, self.settings.builds_at_once)

    def room(self) -> bool:
        return len(self.running) < len(self.free)

    def submit(self, launch: Launch) -> None:
        self.running.append(spawn(launch, _free_slot(self.free, self.running), self.threads))

    def placement(self, launch: Launch) -> str:
        device = next(r.device for r in self.running if r.launch is launch)
        return f" on cuda:{device}" if device is not None else ""

    def poll(self) -> list[Ended]:
        _until_one_ends([r.proc for r in self.running], 1.0)
        ended = []
        for r in list(self.running):
            _echo_progress(r, self.log)
            if r.proc.poll() is None:
                continue
            self.running.remove(r)
            r.logf.close()
            ended.append(self._ended(r.launch, r.proc.returncode))
        return ended

    def _ended(self, launch: Launch, code: int) -> Ended:
        """Done, failed with its log's tail, or killed by a signal: started again while retries are left."""
        spec, retries, most = launch.spec, self.retried.get(launch.spec.run_key, 0), self.settings.max_retries
        if code < 0 and code != -signal.SIGINT and retries < most:
            self.retried[spec.run_key] = retries + 1
            why = f"died of {_signal_name(code)}; retry {retries + 1}/{most} resumes from its checkpoint"
            return Ended(spec, False, why, again=True)
        if code == 0:
            return Ended(spec, True)
        why = tail(launch.run_dir / "run.log")
        if code < 0:  # no Python traceback: say what killed it
            why += f"\n(died of {_signal_name(code)} after {retries} retries)"
        return Ended(spec, False, why)

    def cancel(self) -> None:
        _stop(getattr(self, "running", []))


def cores() -> int:
    """The cores this process may run on: a SLURM job's or container's cpuset and its cgroup's CPU quota,
    not the host's count (a run given every core of a 64-core node while its job holds 4 oversubscribes
    them ~16x)."""
    return usable_cores()


def _until_one_ends(procs: list[subprocess.Popen], seconds: float) -> None:
    """Wait ``seconds`` (the progress echo's beat), or less once one of ``procs`` has ended: the next
    run starts at once, not up to a second later."""
    deadline = time.monotonic() + seconds
    while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)


def spawn(launch: Launch, device: str | None, threads: int) -> _Running:
    """Start ``launch``'s process on GPU ``device`` (None: no GPU) with ``threads`` cores' share, its
    output appended to the run's log."""
    env = {**os.environ, **launch.env, **child_env()}
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # packed runs fragment less
    share_cores(env, threads)  # concurrent runs share the cores instead of oversubscribing, and do not spin
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a native crash prints its Python stack to run.log
    log_path = launch.run_dir / "run.log"
    offset = log_path.stat().st_size if log_path.is_file() else 0  # echo only this attempt's lines
    logf = log_path.open("a")
    cmd = with_gpus(launch.cmd, device.count(",") + 1 if device is not None else 1)
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
    return _Running(proc, launch, device, logf, offset)


def _stop(running: list[_Running]) -> None:
    """Stop the running runs (SIGTERM, SIGKILL after 20 s); a re-run resumes them from their checkpoints."""
    import psutil

    from runners.tracking.server_processes import stop

    procs = []
    for r in running:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(r.proc.pid))
    stop(procs)
    for r in running:
        r.proc.wait()
        r.logf.close()


def _signal_name(returncode: int) -> str:
    try:
        return f"{signal.Signals(-returncode).name} (signal {-returncode})"
    except ValueError:
        return f"signal {-returncode}"


def _echo_progress(r: _Running, log: Callable[[str], None]) -> None:
    """Print the run's new progress lines (steps with mean@16, base-model build, resume)."""
    path = r.launch.run_dir / "run.log"
    try:
        with path.open("rb") as f:
            f.seek(r.offset)
            chunk = f.read()
    except OSError:
        return
    r.offset += len(chunk)
    lines = (r.partial + chunk.decode(errors="replace")).split("\n")
    r.partial = lines.pop()  # an unfinished last line waits for the next read
    spec = r.launch.spec
    for line in lines:
        line = line.split("\r")[-1].strip()
        if any(m in line for m in PROGRESS_MARKS):
            log(f"    {spec.variant} seed {spec.seed}: {line}")


def _free_slot(free: list[str | None], running: list[_Running]) -> str | None:
    busy = [r.device for r in running]
    for dev in dict.fromkeys(free):
        if busy.count(dev) < free.count(dev):
            return dev
    return None  # pragma: no cover - callers only ask when a slot is free

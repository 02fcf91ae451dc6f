"""The local scheduler: a campaign's runs as processes on this machine, as many at once as it has
slots (``parallel`` on CPU, ``runs_per_gpu`` per GPU on every visible GPU), with each run's
progress echoed to the console as it happens.

It shares its interface with the Ray backend (``runners.ops.cluster.run_on_ray``): a list of runs
and a ``prepare(spec) -> Launch`` callback that gives each its MLflow run and command; both
return the failures with the last lines of their logs. A run that dies of a signal (a segfault in
native code, the kernel's OOM killer) is started again up to ``max_retries`` times: it resumes from
its checkpoint. A Python error is not retried (it would fail the same way); every run has
Python's faulthandler on, so a native crash leaves its stack in ``run.log``. Every process it
starts dies with it (``locks.child_env``): a campaign killed with ``kill -9`` leaves no trainer
writing in a run folder that its next run would resume.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from runners.ops.campaign import Campaign, CampaignError, RunSpec
from runners.ops.locks import child_env
from runners.threads import share_cores, usable_cores

PROGRESS_MARKS = (
    "] step ",
    "building base model",
    "SFT",
    "base model ready",
    "resuming",
    "stopped at step",
    "done in ",
    "tracking server",  # a write the tracking server did not take, and why (``tracking.MlflowSink``)
)


@dataclass
class Launch:
    """One run ready to start: its command, the environment naming its MLflow run, its folder."""

    spec: RunSpec
    cmd: list[str]
    env: dict[str, str]
    run_dir: Path


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
    calls give up in about 60 s (``tracking.HTTP_LIMITS``)."""
    from runners.ops.tracking import http_limits

    rdir = run_folder(root, spec)
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "recipe.yaml").write_text(spec.recipe.to_yaml())
    cmd = [sys.executable, "-m", "runners", "train", str(rdir / "recipe.yaml"), "--run-dir", str(rdir)]
    return Launch(spec, cmd, {"MLFLOW_TRACKING_URI": uri, "MLFLOW_RUN_ID": run_id, **http_limits()}, rdir)


def tail(path: Path, n: int = 5) -> str:
    """The last ``n`` non-empty lines of a run's log."""
    if not path.is_file():
        return ""
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    return "\n".join(lines[-n:])


def devices() -> list[str | None]:
    """Visible CUDA devices as CUDA_VISIBLE_DEVICES values, or ``[None]`` (CPU)."""
    try:
        import torch

        n = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch CUDA: CPU
        n = 0
    return [str(i) for i in range(n)] or [None]


def slots(camp: Campaign) -> list[str | None]:
    """One slot per concurrent run: GPUs x runs_per_gpu, or ``parallel`` CPU slots."""
    devs = devices()
    if devs == [None]:
        return [None] * max(1, camp.parallel)
    n = max(1, camp.gpus_per_run)
    if n > len(devs):
        raise CampaignError(f"{camp.path}: gpus_per_run = {n}, but only {len(devs)} GPU(s) are visible")
    groups = [",".join(devs[i : i + n]) for i in range(0, len(devs) - n + 1, n)]  # "0,1", "2,3", ...
    return [g for g in groups for _ in range(max(1, camp.runs_per_gpu))]


def build_base_models(todo: list[RunSpec], root: Path, device: str | None, log: Callable[[str], None]) -> None:
    """Build each distinct embedded base model once, before runs that share it start.

    Packed runs that each found the cache empty would all build it at once (measured on an H200:
    416-550 s each for 4 concurrent builds against 118-146 s for one alone).
    """
    from runners.task.sizes import base_model_path

    users: dict[Path, list[RunSpec]] = {}
    for spec in todo:
        if spec.recipe.model.size is not None:
            users.setdefault(base_model_path(spec.recipe.model.size, spec.recipe.data.task), []).append(spec)
    for path, specs in users.items():
        if (path / "build_info.json").is_file():
            continue
        log(f"building base model {path.name} once for {len(specs)} run(s)" + (f" on cuda:{device}" if device else ""))
        root.mkdir(parents=True, exist_ok=True)
        recipe_file = root / f"base-{path.name}.yaml"
        recipe_file.write_text(specs[0].recipe.to_yaml())
        env = {**os.environ, **child_env()}
        share_cores(env, cores())  # it runs alone: every core, waiting passively
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
                log("  " + line.rstrip())
        if proc.wait() != 0:  # every run would fail the same way: say why once
            raise CampaignError(f"building base model {path.name} failed: {(out or ['no output'])[-1]}")


def run_local(
    camp: Campaign,
    todo: list[RunSpec],
    prepare: Callable[[RunSpec], Launch],
    root: Path,
    log: Callable[[str], None],
    monitor: Callable[[], None] | None = None,
) -> list[tuple[RunSpec, str]]:
    """Run ``todo`` as local processes, as many at once as there are slots; returns the failures.
    ``monitor`` (an adaptive campaign's decisions) is called between polls."""
    free = slots(camp) if todo else []
    if todo:
        build_base_models(todo, root, free[0], log)
    running: list[_Running] = []
    queue, failures, done_count, t0 = list(todo), [], 0, time.perf_counter()
    retried: dict[str, int] = {}
    threads = max(1, cores() // max(1, len(free)))
    try:
        while queue or running:
            while queue and len(running) < len(free):
                spec = queue.pop(0)
                device = _free_slot(free, running)
                running.append(_start(prepare(spec), device, threads))
                log(
                    f"[{done_count + len(running)}/{len(todo)}] {'retry' if spec.run_key in retried else 'start'}"
                    f" {spec.variant} seed {spec.seed}" + (f" on cuda:{device}" if device is not None else "")
                )
            time.sleep(1.0)
            if monitor is not None:
                monitor()
            for r in list(running):
                _echo_progress(r, log)
                if r.proc.poll() is None:
                    continue
                running.remove(r)
                r.logf.close()
                spec, elapsed, code = r.launch.spec, time.perf_counter() - t0, r.proc.returncode
                if code < 0 and code != -signal.SIGINT and retried.get(spec.run_key, 0) < camp.max_retries:
                    retried[spec.run_key] = retried.get(spec.run_key, 0) + 1
                    log(
                        f"[{done_count + 1}/{len(todo)}] {spec.variant} seed {spec.seed} died of {_signal_name(code)};"
                        f" retry {retried[spec.run_key]}/{camp.max_retries} resumes from its checkpoint"
                    )
                    queue.insert(0, spec)
                    continue
                done_count += 1
                if code == 0:
                    log(f"[{done_count}/{len(todo)}] done  {spec.variant} seed {spec.seed}  ({elapsed:.0f} s so far)")
                else:
                    last_lines = tail(r.launch.run_dir / "run.log")
                    if code < 0:  # no Python traceback: say what killed it
                        last_lines += f"\n(died of {_signal_name(code)} after {retried.get(spec.run_key, 0)} retries)"
                    failures.append((spec, last_lines))
                    last = last_lines.splitlines()[-1] if last_lines else ""
                    log(f"[{done_count}/{len(todo)}] FAILED {spec.variant} seed {spec.seed}: {last}")
    except BaseException:  # the campaign cannot go on (its tracking server is lost, an interrupt): its runs stop
        _stop(running)
        raise
    return failures


def cores() -> int:
    """The cores this process may run on: a SLURM job's or container's cpuset and its cgroup's CPU quota,
    not the host's count (a run given every core of a 64-core node while its job holds 4 oversubscribes
    them ~16x)."""
    return usable_cores()


def _start(launch: Launch, device: str | None, threads: int) -> _Running:
    env = {**os.environ, **launch.env, **child_env()}
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # packed runs fragment less
    share_cores(env, threads)  # concurrent runs share the cores instead of oversubscribing, and do not spin
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a native crash prints its Python stack to run.log
    log_path = launch.run_dir / "run.log"
    offset = log_path.stat().st_size if log_path.is_file() else 0  # echo only this attempt's lines
    logf = log_path.open("a")
    cmd = list(launch.cmd)
    if device is not None and "," in device:
        cmd += ["--gpus", str(device.count(",") + 1)]
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
    return _Running(proc, launch, device, logf, offset)


def _stop(running: list[_Running]) -> None:
    """Stop the running runs (SIGTERM, SIGKILL after 20 s); a re-run resumes them from their checkpoints."""
    import psutil

    from runners.ops.servers import stop

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

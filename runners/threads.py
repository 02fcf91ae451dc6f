"""CPU threads: the cores this process may use (its affinity mask and its cgroup's CPU quota) and the
OpenMP settings its torch processes start with, shared among the runs running at once.

Oversubscribed OpenMP threads spin: torch's threads busy-wait at every parallel region's barrier,
so a run whose cores are shared with another process (a second run, a test suite, a browser) waits
for a descheduled thread while its others burn the core it needs. Measured on 2 pinned cores of an
Intel Xeon with one CPU-bound process beside it, the embedded base model's build took 104 s alone
and over 12 minutes beside it with OpenMP's default wait policy, 163 s with ``OMP_WAIT_POLICY=PASSIVE``
(docs/benchmarks.md). Nothing here imports torch: the settings must be in the environment before
torch loads its OpenMP runtime.
"""

from __future__ import annotations

import math
import os
from collections.abc import MutableMapping
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
COMPUTE_COMMANDS = ("train", "base-model")  # the `python -m runners` commands that run torch themselves


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _quota(folder: Path) -> float | None:
    """CPUs a cgroup folder's quota allows: v2 ``cpu.max`` ("max 100000" = none), v1 ``cpu.cfs_quota_us``
    over ``cpu.cfs_period_us`` (-1 = none)."""
    v2 = _read(folder / "cpu.max")
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        return int(quota) / int(period or 100000) if quota != "max" else None
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    if quota is None or period is None or int(quota) <= 0:
        return None
    return int(quota) / int(period)


def cgroup_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The tightest CPU quota on this process's cgroup and its ancestors (a container's, a SLURM job's),
    in CPUs; None where no quota is set or cgroups cannot be read."""
    lines = (_read(proc_cgroup) or "").splitlines()
    found: list[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: 0::/path, the files under the unified root
            base = root
        elif "cpu" in controllers.split(","):  # v1: n:cpu,cpuacct:/path
            base = next((root / n for n in (controllers, "cpu,cpuacct", "cpu") if (root / n).is_dir()), root / "cpu")
        else:
            continue
        folder = base / path.lstrip("/")
        while True:  # a quota may sit on any ancestor
            q = _quota(folder)
            if q is not None:
                found.append(q)
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return min(found) if found else None


def usable_cores(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int:
    """The cores this process may run on: its affinity mask (a SLURM job's or container's cpuset), capped
    by its cgroup's CPU quota (rounded up: 1.5 CPUs run 2 threads), never the host's count alone."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpus(root, proc_cgroup)
    return max(1, min(n, math.ceil(quota)) if quota else n)


def thread_env(threads: int) -> dict[str, str]:
    """The environment a torch process starts with to use ``threads`` cores without spin-waiting on them."""
    return {"OMP_NUM_THREADS": str(max(1, threads)), "OMP_WAIT_POLICY": "PASSIVE"}


def share_cores(env: MutableMapping[str, str], threads: int) -> None:
    """Give a child's environment ``thread_env(threads)``, keeping what the caller set itself (a test
    worker's share, a user's ``OMP_NUM_THREADS``)."""
    for key, value in thread_env(threads).items():
        env.setdefault(key, value)


def configure(command: str, processes: int = 1, env: MutableMapping[str, str] = os.environ) -> None:
    """At the start of ``python -m runners COMMAND``, before torch is imported: OpenMP waits passively
    (inherited by every process it starts), and a command that computes itself gets the usable cores,
    divided among the ``processes`` it launches on them (``train --gpus N``). Other commands set no
    thread count: the runs they start get their share (``runners.campaign.backends.local``)."""
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if command in COMPUTE_COMMANDS:
        share_cores(env, usable_cores() // max(1, processes))

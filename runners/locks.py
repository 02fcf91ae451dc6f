"""One writer at a time: exclusive locks on what a process writes (a run folder, a campaign on a
store), the holder named to whoever is refused.

A lock is ``filelock``'s (``flock``): the kernel releases it when its holder dies, ``kill -9``
included, so no lock outlives its process. Beside it, ``<lock>.json`` names the holder (pid,
command, start time) for the refusal's message; it is only read while the lock is held by
someone, so a stale one left by a killed holder is harmless (the next holder rewrites it).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from runners.recipe import Recipe
from runners.runfolder import claim


class Busy(RuntimeError):
    """Another live process holds the lock; the message names it and what to do."""


def holder(lock_path: Path) -> str:
    """The holder of a lock as its record names it: ``pid N (command, since HH:MM:SS)``."""
    for _ in range(10):  # a holder that has just taken the lock writes its record a moment later
        try:
            info = json.loads(Path(f"{lock_path}.json").read_text())
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
            return f"pid {info['pid']} ({info['command']}, since {since})"
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.1)
    return "another process (its pid was not recorded)"


def _program() -> str:
    """How this process was started: ``python -m runners`` rather than the path of its ``__main__.py``."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    return f"python -m {argv0.parent.name}" if argv0.name == "__main__.py" else f"python {argv0.name}"


@contextlib.contextmanager
def hold(lock_path: Path, what: str, advice: str) -> Iterator[None]:
    """Hold the exclusive lock ``lock_path`` for the block, or raise ``Busy`` at once, in one
    line: ``{what} is in use by pid N (...); {advice}``."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise Busy(f"{what} is in use by {holder(lock_path)}; {advice}") from None
    record = Path(f"{lock_path}.json")
    try:
        tmp = record.with_name(f"{record.name}.{os.getpid()}.tmp")
        command = " ".join([_program(), *sys.argv[1:]])[:200]
        tmp.write_text(json.dumps({"pid": os.getpid(), "command": command, "since": time.time()}))
        tmp.replace(record)
        yield
    finally:
        record.unlink(missing_ok=True)
        lock.release()


LOCK_FILE = "train.lock"  # in a run's folder, held by the process that trains it


@contextlib.contextmanager
def writer(run_dir: Path, recipe: Recipe) -> Iterator[None]:
    """Be the one process that trains ``run_dir``, for the block: its lock (or ``locks.Busy``
    naming the holder), then its identity (``runners.runfolder.claim``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    advice = "wait for it to finish, or stop it and re-run (the run resumes from its last checkpoint)"
    with hold(run_dir / LOCK_FILE, f"run folder {run_dir.resolve()}", advice):
        claim(run_dir, recipe)
        yield

"""Processes that die with the process that started them: Linux's parent-death signal
(``prctl(PR_SET_PDEATHSIG)``) plus the check that the starter is not already gone, written once
(``_arming``) for the two ways a process gets it. Off Linux, nothing. The standard library only.

- ``parent_death_preexec``: the starter arms the child between fork and exec, for programs that are
  not ours (the ``accelerate`` launcher, an MLflow or PostgreSQL server, a SLURM job's run).
- ``child_env`` and ``die_with_parent``: a Python process of ours (a campaign's trainer, a base-model
  build) is started with ``child_env()`` and arms itself first thing (``runners.cli.main``), as a rank
  started by ``accelerate``/``torchrun`` does. Its starter (a campaign, a Ray worker, whose threads
  make ``preexec_fn`` unsafe) then needs no code between fork and exec.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
SIG_DFL = 0  # <signal.h>: a signal's default action

#: Set in the environment of a process a campaign starts: the starter's pid. The child, on
#: Linux, asks the kernel to kill it when that parent dies (``die_with_parent``).
PARENT_ENV = "PRL_DIE_WITH_PARENT"


def _arming(sig: int, parent: int | None) -> Callable[[], None] | None:
    """What arms a process: ``sig`` to it when the thread that started it dies and, given the
    starter's pid ``parent``, ``sig`` at once where that parent died before the signal was armed;
    None off Linux. libc is looked up here, so that the result, run between fork and exec, only
    makes system calls."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    prctl, c_signal = libc.prctl, libc.signal
    c_signal.argtypes, c_signal.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if parent is not None and os.getppid() != parent:
            # the default action, not a handler the starter installed (a Python one would raise here)
            c_signal(sig, SIG_DFL)
            os.kill(os.getpid(), sig)

    return arm


def parent_death_preexec(sig: int = signal.SIGKILL, parent: int | None = None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that arms the child (``_arming``): ``sig`` when its starter's thread dies,
    and at once where the starter, pid ``parent``, is already gone; None off Linux."""
    return _arming(sig, parent)


def child_env() -> dict[str, str]:
    """Environment for a child of ours that must not outlive this process (``die_with_parent``)."""
    return {PARENT_ENV: str(os.getpid())}


def die_with_parent() -> None:
    """In a process started with ``child_env()`` (a campaign's trainer) or by an ``accelerate``/
    ``torchrun`` launcher (a rank of a distributed run): SIGKILL when the starter dies, so that a
    campaign killed with ``kill -9`` leaves no trainer writing in its run folder; at once where the
    starter died before this line ran. A process started by a user may outlive its shell (nohup)."""
    starter = os.environ.pop(PARENT_ENV, None)
    if starter is None and "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    arm = _arming(signal.SIGKILL, int(starter) if starter is not None else None)
    if arm is not None:
        arm()

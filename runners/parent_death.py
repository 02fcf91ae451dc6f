"""Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``), for the processes the project starts
that must not outlive their starter: a campaign's trainers, a launcher's ranks, a tracking
server. Off Linux, nothing. The standard library only."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
SIG_DFL = 0  # <signal.h>: a signal's default action


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` on Linux, else None."""
    return ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Linux: ``sig`` to this process when the thread that started it dies; elsewhere nothing."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def parent_death_preexec(sig: int = signal.SIGKILL, parent: int | None = None) -> Callable[[], None] | None:
    """A ``preexec_fn`` with the effect of ``set_parent_death_signal(sig)`` in the child and, given
    the starter's pid ``parent``, ``sig`` at once where that parent died before the signal was
    armed; None off Linux. libc is looked up here, in the parent: between fork and exec the child
    only makes system calls."""
    prctl = _prctl()
    if prctl is None:
        return None
    c_signal = ctypes.CDLL(None, use_errno=True).signal
    c_signal.argtypes, c_signal.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if parent is not None and os.getppid() != parent:
            # the default action, not a handler the starter installed (a Python one would raise here)
            c_signal(sig, SIG_DFL)
            os.kill(os.getpid(), sig)

    return preexec

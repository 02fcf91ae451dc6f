"""Linux's parent-death signal (runners/parent_death.py), on real processes: a child started with
``parent_death_preexec`` gets the signal when the thread that started it ends, and at once where
its starter was gone before the signal was armed."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Callable

import pytest

from runners.parent_death import parent_death_preexec

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def _started_in_a_thread(preexec: Callable[[], None] | None) -> subprocess.Popen:
    """A sleeping child started by a thread that has ended since."""
    started: list[subprocess.Popen] = []
    starter = threading.Thread(target=lambda: started.append(subprocess.Popen(SLEEP, preexec_fn=preexec)))
    starter.start()
    starter.join()
    return started[0]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_child_dies_of_its_signal_when_the_thread_that_started_it_ends(sig):
    child = _started_in_a_thread(parent_death_preexec(sig))
    try:
        assert child.wait(timeout=30) == -sig
    finally:
        child.kill()


def test_a_child_whose_starter_is_already_gone_dies_at_once():
    """The starter's pid given is not the child's parent: the parent died before ``prctl`` ran."""
    child = subprocess.Popen(SLEEP, preexec_fn=parent_death_preexec(signal.SIGTERM, parent=1))
    try:
        assert child.wait(timeout=30) == -signal.SIGTERM
    finally:
        child.kill()


def test_a_child_whose_starter_is_gone_dies_even_where_the_starter_handles_the_signal():
    """Seen in make test: a starter with a Python SIGTERM handler (a pytest-xdist worker) got
    "Exception occurred in preexec_fn": the forked child ran the handler instead of dying."""
    script = (
        "import signal, subprocess, sys\n"
        "from runners.parent_death import parent_death_preexec\n"
        "def stop(*_): raise SystemExit('handled')\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"child = subprocess.Popen({SLEEP!r}, preexec_fn=parent_death_preexec(signal.SIGTERM, parent=1))\n"
        "print(child.wait(timeout=30))\n"
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == str(-signal.SIGTERM), res.stderr[-2000:]


def test_without_the_signal_a_child_outlives_the_thread_that_started_it():
    """The control: the same child started plainly is still running after its thread ended."""
    child = _started_in_a_thread(None)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=1)
    finally:
        child.kill()
        child.wait()

"""Linux's parent-death signal (runners/parent_death.py), on real processes: a child started with
``parent_death_preexec``, or with ``child_env()`` and arming itself (``die_with_parent``, as a
campaign's trainer does), gets the signal when the thread that started it ends, and at once where
its starter was gone before the signal was armed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

import psutil
import pytest

from runners.parent_death import PARENT_ENV, parent_death_preexec

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
#: a child of ours: it arms itself first thing, as ``runners.cli.main`` does
ARMS_ITSELF = [
    sys.executable,
    "-c",
    "from runners.parent_death import die_with_parent; die_with_parent(); print('armed', flush=True); "
    "import time; time.sleep(60)",
]


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


def test_a_child_of_ours_dies_when_its_starter_is_killed():
    """The same signal armed by the child itself (``child_env()``, then ``die_with_parent``): its
    starter killed with SIGKILL, it goes too."""
    script = (
        "import os, subprocess, sys, time\n"
        "from runners.parent_death import child_env\n"
        f"child = subprocess.Popen({ARMS_ITSELF!r}, env={{**os.environ, **child_env()}})\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    starter = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid, armed = int(starter.stdout.readline()), starter.stdout.readline()  # type: ignore[union-attr]
        assert armed.strip() == "armed"
        child = psutil.Process(pid)
        starter.kill()
        starter.wait()
        assert not psutil.wait_procs([child], timeout=30)[1], "the child outlived its starter"
    finally:
        starter.kill()
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()


def test_a_child_of_ours_whose_starter_is_already_gone_dies_at_once():
    """``PRL_DIE_WITH_PARENT`` names a pid that is not the child's parent: its starter is gone."""
    child = subprocess.Popen(ARMS_ITSELF, env={**os.environ, PARENT_ENV: "1"}, stdout=subprocess.DEVNULL)
    try:
        assert child.wait(timeout=60) != 0
    finally:
        child.kill()


def test_without_the_signal_a_child_outlives_the_thread_that_started_it():
    """The control: the same child started plainly is still running after its thread ended."""
    child = _started_in_a_thread(None)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=1)
    finally:
        child.kill()
        child.wait()

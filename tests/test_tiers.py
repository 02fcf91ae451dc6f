"""`make test`'s two tiers: the quick one by default (every test not marked slow), every test where CI is set
or with TESTS=all, and under CI no marker may leave a test out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what a shell outside make and outside CI has: the parent make's flags and the tier's variables removed
CLEAN = {k: v for k, v in os.environ.items() if k not in {"CI", "TESTS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}


def pytest_line(*args: str, **env: str) -> str:
    """The pytest command ``make -n test ARGS`` would run, in an environment with ``env`` added."""
    res = subprocess.run(
        ["make", "-n", *args, "test"], cwd=ROOT, env=CLEAN | env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    (line,) = [x for x in res.stdout.splitlines() if " -m pytest " in x]
    return line


def test_make_test_runs_the_quick_tier_by_default_and_every_test_under_ci_or_when_asked():
    assert pytest_line().endswith('-m "not slow"')
    assert pytest_line("TESTS=quick", CI="true").endswith('-m "not slow"')
    for every in (pytest_line(CI="true"), pytest_line("TESTS=all"), pytest_line("TESTS=all", CI="true")):
        assert " -m " not in every.split(" -m pytest ", 1)[1], every
    res = subprocess.run(["make", "-n", "TESTS=fast", "test"], cwd=ROOT, env=CLEAN, capture_output=True, text=True)
    assert res.returncode != 0 and not res.stdout, res.stdout  # refused as the Makefile is read: nothing ran
    assert "TESTS=fast" in res.stderr and "TESTS=quick" in res.stderr and "TESTS=all" in res.stderr, res.stderr


def test_under_ci_a_marker_selection_is_refused_before_any_test_runs():
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "-m", "not slow"]
    cmd.append("tests/test_docs.py")
    res = subprocess.run(cmd, cwd=ROOT, env=CLEAN | {"CI": "true"}, capture_output=True, text=True, timeout=120)
    assert res.returncode == 4, res.stdout[-2000:]  # pytest's usage error
    assert "under CI every test runs" in res.stderr and "'not slow'" in res.stderr and "TESTS=all" in res.stderr
    res = subprocess.run(cmd, cwd=ROOT, env=CLEAN, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "tests collected" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]

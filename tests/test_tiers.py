"""`make test`'s two tiers: the quick one by default (every test not marked slow), every test where CI is set
or with TESTS=all; under CI no selection may leave a test out and no skip, of a test or of a module, passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
        args = every.split(" -m pytest ", 1)[1].split()
        assert not {"-m", "-k", "--deselect", "--ignore", "--ignore-glob", "--lf", "--sw"} & set(args), every
        assert not [a for a in args if a.startswith(("--deselect=", "--ignore=", "--ignore-glob=", "-k"))], every
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


# the tests planted in a folder of their own, run by a real pytest with this project's conftest as a plugin
FINE = "def test_fine():\n    pass\n"
SKIP_IN_A_TEST = 'import pytest\n\n\ndef test_needs_chromium():\n    pytest.skip("no chromium here")\n'
SKIP_OF_A_MODULE = (
    'import pytest\n\npytest.skip("no postgres here", allow_module_level=True)\n\n\ndef test_a():\n    pass\n'
)
DESELECTING_PLUGIN = (
    "def pytest_collection_modifyitems(config, items):\n"
    "    config.hook.pytest_deselected(items=items[:1])\n"
    "    items[:] = items[1:]\n"
)


def planted_pytest(folder: Path, *args: str, ci: bool) -> subprocess.CompletedProcess:
    """``python -m pytest ARGS`` run from the project (its pyproject's options, ``tests.conftest`` as a
    plugin) on the test files planted in ``folder``, with ``CI=true`` or without ``CI``."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-o", f"cache_dir={folder / 'cache'}", *args]
    env = CLEAN | {"PYTHONPATH": str(folder)} | ({"CI": "true"} if ci else {})
    return subprocess.run(cmd + [str(folder)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("planted", "workers", "ci_code", "said"),
    [
        ({"test_planted.py": SKIP_IN_A_TEST}, [], 1, ["FAILED"]),
        ({"test_planted.py": SKIP_OF_A_MODULE}, [], 2, ["ERROR collecting"]),  # pytest's collection error
        pytest.param(  # 20-40 s on 2 cores: an xdist worker imports the project's backends
            {"test_in.py": SKIP_IN_A_TEST, "test_of.py": SKIP_OF_A_MODULE},
            ["-n", "1"],
            1,
            ["FAILED", "ERROR"],
            marks=pytest.mark.slow,
        ),
    ],
    ids=["in-a-test", "of-a-module", "both-under-xdist"],  # make test's xdist: the worker's reports
)
def test_under_ci_a_skip_fails_in_a_test_and_of_a_module(tmp_path, planted, workers, ci_code, said):
    (tmp_path / "test_fine.py").write_text(FINE)
    for name, text in planted.items():
        (tmp_path / name).write_text(text)
    res = planted_pytest(tmp_path, *workers, ci=True)
    out = res.stdout[-3000:] + res.stderr[-2000:]
    assert res.returncode == ci_code, out
    for what in said:
        assert what in res.stdout, out
    fails = [x for x in res.stdout.splitlines() if "skipped under CI, which counts as a failure: Skipped: no " in x]
    assert len(fails) == 2 * len(planted), out  # each in its section and in -ra's summary
    if not workers:  # outside CI a skip stays a skip
        res = planted_pytest(tmp_path, ci=False)
        assert res.returncode == 0 and "1 passed, 1 skipped" in res.stdout, res.stdout[-3000:] + res.stderr[-2000:]


SELECTIONS = [["-k", "fine"], ["--deselect", "test_planted.py::test_a"], ["--ignore", "test_planted.py"]]
SELECTIONS += [["--ignore-glob", "*planted*"], ["--lf"], ["--sw"]]


def test_under_ci_a_selection_on_the_command_line_is_refused_before_any_test_runs(tmp_path):
    (tmp_path / "test_fine.py").write_text(FINE)
    (tmp_path / "test_planted.py").write_text("def test_a():\n    pass\n")
    args = [str(tmp_path / a) if a.startswith("test_") else a for s in SELECTIONS for a in s]
    res = planted_pytest(tmp_path, *args, ci=True)
    assert res.returncode == 4, res.stdout[-2000:] + res.stderr[-2000:]  # pytest's usage error
    assert "under CI every test runs, so a selection (" in res.stderr and "TESTS=all" in res.stderr, res.stderr
    for option, *_ in SELECTIONS:  # each one named
        assert f"{option} " in res.stderr or f"{option})" in res.stderr or f"{option}," in res.stderr, option
    assert "passed" not in res.stdout, res.stdout[-2000:]
    res = planted_pytest(tmp_path, *args, ci=False)  # accepted outside CI: test_fine runs
    assert res.returncode == 0 and "1 passed" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]


def test_under_ci_a_plugin_that_deselects_a_test_is_refused(tmp_path):
    (tmp_path / "test_fine.py").write_text(FINE)
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    (tmp_path / "deselecting.py").write_text(DESELECTING_PLUGIN)
    res = planted_pytest(tmp_path, "-p", "deselecting", ci=True)
    assert res.returncode == 4, res.stdout[-2000:] + res.stderr[-2000:]
    assert "so deselecting 1 of them (" in res.stderr and "test_fine.py::test_fine" in res.stderr, res.stderr[-2000:]
    res = planted_pytest(tmp_path, "-p", "deselecting", ci=False)
    assert res.returncode == 0 and "1 passed, 1 deselected" in res.stdout, res.stdout[-2000:]

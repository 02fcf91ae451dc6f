"""A run folder belongs to one run identity and has one writer.

A single run's default folder is keyed by its identity, ``artifacts/runs/NAME-seedS-<run_key>``
(``runners.ops.campaign.run_key``, the identity campaigns key their runs by), so a command with
other settings gets a folder of its own. The identity is also written into the folder
(``identity.json``, at its creation), and a run whose identity differs from the folder's is
refused in one line naming the keys that differ. ``done.json`` there means the run is finished:
nothing left to train. The process that trains a folder holds its lock (``train.lock``) for the
whole run; a second one is refused naming the holder's pid.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runners.ops.campaign import code_version, run_key
from runners.ops.folders import RunFolderError
from runners.ops.locks import hold
from runners.recipe import Recipe, RecipeError, load_recipe

IDENTITY_FILE = "identity.json"
DONE_FILE = "done.json"
LOCK_FILE = "train.lock"
RUNS_DIR = Path("artifacts/runs")


def default_run_dir(recipe: Recipe) -> Path:
    """A single run's folder: its name, seed and identity."""
    return RUNS_DIR / f"{recipe.name.replace('/', '-')}-seed{recipe.train.seed}-{run_key(recipe)}"


def _identity(recipe: Recipe) -> dict[str, Any]:
    flat = json.loads(json.dumps(recipe.flat(), default=str))  # as stored: JSON values
    return {"run_key": run_key(recipe), "code": code_version(), "recipe": flat}


def _fmt(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _differences(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    """``key: theirs -> mine`` for each recipe key (and the code version) that differs."""
    a, b = theirs["recipe"], mine["recipe"]
    if a is None:
        return "no record of its recipe"
    diffs = [f"{k}: {_fmt(a.get(k))} -> {_fmt(b.get(k))}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    if theirs.get("code") not in (None, mine["code"]):
        diffs.append(f"code version: {theirs['code']} -> {mine['code']}")
    return ", ".join(diffs[:6]) + (f" and {len(diffs) - 6} more" if len(diffs) > 6 else "")


def _recorded(run_dir: Path) -> dict[str, Any] | None:
    """The identity the folder records: ``identity.json``, or for a folder written before there was
    one, its ``recipe.yaml`` (no run key: the code version is unknown); ``{"recipe": None}`` for a
    run with no readable record; None for a folder that holds no run yet."""
    path = run_dir / IDENTITY_FILE
    if path.is_file():
        with contextlib.suppress(ValueError):  # cut short by a kill at creation: judge by the recipe
            return json.loads(path.read_text())
    if (run_dir / "recipe.yaml").is_file():
        try:
            return {"recipe": _identity(load_recipe(run_dir / "recipe.yaml"))["recipe"]}
        except RecipeError:
            return {"recipe": None}
    if any((run_dir / name).exists() for name in ("metrics.jsonl", "checkpoints", DONE_FILE)):
        return {"recipe": None}
    return None


def claim(run_dir: Path, recipe: Recipe) -> None:
    """Make ``run_dir`` this run's folder: record the identity in a folder that holds no run yet,
    accept one that holds this run, refuse (``RunFolderError``) one that holds another."""
    mine = _identity(recipe)
    theirs = _recorded(run_dir)
    if theirs is not None:
        same = theirs["run_key"] == mine["run_key"] if "run_key" in theirs else theirs["recipe"] == mine["recipe"]
        if not same:
            raise RunFolderError(
                f"{run_dir.resolve()} holds another run ({_differences(mine, theirs)}); this recipe's own folder "
                f"is {default_run_dir(recipe)} (leave out --run-dir), or pass another --run-dir"
            )
        if "run_key" in theirs:
            return
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f"{IDENTITY_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(mine, indent=1) + "\n")
    tmp.replace(run_dir / IDENTITY_FILE)


def finished(run_dir: Path) -> dict[str, Any] | None:
    """The final result a finished run recorded (``done.json``), else None."""
    try:
        return json.loads((run_dir / DONE_FILE).read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def writer(run_dir: Path, recipe: Recipe) -> Iterator[None]:
    """Be the one process that trains ``run_dir``, for the block: its lock (or ``locks.Busy``
    naming the holder), then its identity (``claim``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    advice = "wait for it to finish, or stop it and re-run (the run resumes from its last checkpoint)"
    with hold(run_dir / LOCK_FILE, f"run folder {run_dir.resolve()}", advice):
        claim(run_dir, recipe)
        yield

"""A run's folder: one run identity and one writer, and its filesystem faults as one line each.

A single run's default folder is keyed by its identity, ``artifacts/runs/NAME-seedS-<run_key>``
(``runners.identity.run_key``, the identity campaigns key their runs by), so a command with
other settings gets a folder of its own. The identity is also written into the folder
(``identity.json``, at its creation), and a run whose identity differs from the folder's is
refused in one line naming the keys that differ. ``done.json`` there means the run is finished:
nothing left to train. The process that trains a folder holds its lock for the whole run
(``runners.locks.writer``). ``store.json`` names the MLflow store (and run) the folder's run
is tracked in, so that a campaign pointed at another store can say so (``remember_store``). A
folder created here is private to its owner (``runners.permissions``).

Faults, each naming the folder and the fix: a folder this process cannot write (checked before
anything loads), a disk that fills up mid-run, and a JSON-lines file appended to so that a line a
full disk or a kill cut short never swallows the next. A full disk surfaces as
``OSError(ENOSPC)``, as the system's words inside another error (safetensors', SQLite's), or wrapped
by torch's zip writer as ``RuntimeError: [enforce fail at inline_container.cc] . unexpected pos`` or
``basic_ios::clear: iostream error``, which say nothing of space; such a writer error is taken for a
full disk when the folder's filesystem has (almost) nothing left (``shutil.disk_usage``), and its
text is kept in the message. The checkpoint it cut short has no ``prl_state.json`` (written last),
so a re-run skips it and resumes from the one before (``runners.rl.train.last_complete_checkpoint``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from runners.contract import DONE_FILE, STOP_FILE
from runners.identity import code_version, run_key
from runners.permissions import make_dir
from runners.recipe import Recipe, RecipeError, load_recipe
from runners.task.sizes import base_model_path
from runners.task.tasks import ArithmeticTask

# What torch's writer says when a write comes up short (the reason is not kept).
WRITER_FAILURES = ("unexpected pos", "iostream error", "file write failed")
# The system's own words for a full disk, kept in the text of an error that is no OSError: safetensors'
# ``SafetensorError: ... No space left on device (os error 28)`` (it deletes the file it cut short, so
# the disk is no longer full), Rust's ``StorageFull``.
FULL_DISK_WORDS = ("no space left on device", "disk quota exceeded", "storagefull")
SQLITE_FULL = "database or disk is full"  # SQLite's, for a SQLite file known to be in the folder
NEARLY_FULL = 16 * 2**20  # bytes (or 5% of a smaller disk): less left after a writer failed means a full disk


class RunFolderError(RuntimeError):
    """A run folder that cannot hold the run: unwritable, full, a history it cannot resume, or another
    run's folder; the message names the folder and the fix."""


def _size(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} GiB"


def check_run_folder_writable(folder: Path) -> None:
    """Create ``folder`` if needed and make sure files can be created in it (and in its
    ``checkpoints/`` and ``best/`` if there) and its existing files appended to; else
    ``RunFolderError`` naming the folder. A real write is tried: root ignores permission bits,
    not a read-only mount."""
    folder = Path(folder)
    fix = "make it writable, or train into another folder (--run-dir)"
    try:
        make_dir(folder)  # private (0700), or PRL_GROUP's
    except OSError as e:
        raise RunFolderError(f"cannot create the run folder {folder}: {e.strerror or e}; {fix}") from None
    for d in (folder, folder / "checkpoints", folder / "best"):
        if not d.is_dir():
            continue
        try:
            with tempfile.NamedTemporaryFile(dir=d, prefix=".write-check-"):
                pass
        except OSError as e:
            raise RunFolderError(f"cannot write in the run folder {d}: {e.strerror or e}; {fix}") from None
    for f in sorted(folder.glob("*.json*")) + sorted(folder.glob("*.yaml")):
        try:
            f.open("a").close()
        except OSError as e:
            raise RunFolderError(f"cannot write {f} in the run folder: {e.strerror or e}; {fix}") from None


def unwritable(folder: Path) -> str | None:
    """Why no file can be made in ``folder``, or in the nearest existing folder it would be created
    in: that folder and the system's words (``/x/artifacts: Read-only file system``); None when one
    can. A real write is tried (root ignores permission bits, not a read-only mount); nothing is
    left behind, and no folder is created."""
    folder = Path(folder).absolute()
    existing = next(p for p in (folder, *folder.parents) if p.is_dir())
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".write-check-"):
            pass
    except OSError as e:
        return f"{existing}: {e.strerror or e}"
    return None


def cache_problem(
    size: str, task: ArithmeticTask, cache_dir: Path | None = None, build_seed: int | None = None
) -> str | None:
    """Why base model ``size`` of ``task``, not built yet, cannot be built into its cache (one line
    naming the folder and the fix); None when it is cached or can be built."""
    path = base_model_path(size, task, cache_dir, build_seed)
    if (path / "build_info.json").is_file():
        return None
    why = unwritable(path.parent)
    if why is None:
        return None
    return (
        f"cannot build the base model '{size}' into its cache {path.parent.absolute()} ({why}); make it "
        "writable, or set PRL_CACHE to a writable folder (the cache is PRL_CACHE/base-models)"
    )


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def full_disk(exc: BaseException, folder: Path, words: tuple[str, ...] = ()) -> str | None:
    """When ``exc`` is a write into ``folder`` that ran out of space: ``no space left on the filesystem
    of FOLDER (F free of T) (the error's first line)``; else None. ``words``: more of a writer's words
    for a full disk, where that writer writes only into ``folder`` (``SQLITE_FULL`` for a store there:
    a tracking server's would be the server's disk)."""
    folder = Path(folder)
    causes = list(_chain(exc))
    enospc = any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in causes)
    enospc = enospc or any(m in str(e).lower() for e in causes for m in (*FULL_DISK_WORDS, *words))
    writer = any(m in str(e).lower() for e in causes for m in WRITER_FAILURES)
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        usage = None
    nearly_full = usage is not None and usage.free < min(NEARLY_FULL, usage.total / 20)
    if not (enospc or (writer and nearly_full)):
        return None
    space = f" ({_size(usage.free)} free of {_size(usage.total)})" if usage is not None else ""
    text = str(exc).strip()
    what = f"{type(exc).__name__}: {text.splitlines()[0][:120]}" if text else type(exc).__name__
    return f"no space left on the filesystem of {folder}{space} ({what})"


def disk_full(exc: BaseException, folder: Path, then: str) -> RunFolderError | None:
    """The one-line error for ``exc`` when it is a write into ``folder`` that ran out of space
    (``full_disk``), else None. ``then`` says what a re-run does (e.g. ``it resumes from checkpoint-2``)."""
    why = full_disk(exc, folder)
    if why is None:
        return None
    return RunFolderError(
        f"disk full: {why}; free space there or train into another folder (--run-dir), then re-run: {then}"
    )


def append_json_line(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line. A last line cut short (a full disk, a kill) is ended
    first, so readers skip it alone instead of losing the new line glued onto it."""
    line = json.dumps(record) + "\n"
    with Path(path).open("a+b") as fh:  # writes go to the end whatever was read
        end = fh.seek(0, os.SEEK_END)
        if end:
            fh.seek(end - 1)
            if fh.read(1) != b"\n":
                line = "\n" + line
        fh.write(line.encode())


IDENTITY_FILE = "identity.json"
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


STORE_FILE = "store.json"  # the MLflow store (and run) the folder's run is tracked in
HISTORY = ("metrics.jsonl", "samples.jsonl", "checkpoints", "best", DONE_FILE, STOP_FILE)


def remember_store(run_dir: Path, store: str, run_id: str) -> None:
    """Record in ``run_dir`` the store (``runners.tracking.store.store_key``) and MLflow run it is tracked in."""
    tmp = run_dir / f"{STORE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"store": store, "run_id": run_id}) + "\n")
    tmp.replace(run_dir / STORE_FILE)


def recorded_store(run_dir: Path) -> str | None:
    """The store ``run_dir`` records its run in (``remember_store``), None if it records none."""
    try:
        return json.loads((run_dir / STORE_FILE).read_text())["store"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def has_history(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run's results: evaluations, checkpoints, or its end."""
    return any((run_dir / name).exists() for name in ("metrics.jsonl", "checkpoints", DONE_FILE))


def set_aside(run_dir: Path, prefix: str) -> Path:
    """Move the run's results (``HISTORY``) and its store record into ``run_dir/PREFIX-<time>/``, so
    that the run starts over in the folder; returns that folder."""
    aside = run_dir / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
    aside.mkdir()
    for name in (*HISTORY, STORE_FILE):
        if (run_dir / name).exists():
            (run_dir / name).rename(aside / name)
    return aside


def finished(run_dir: Path) -> dict[str, Any] | None:
    """The final result a finished run recorded (``done.json``), else None."""
    try:
        return json.loads((run_dir / DONE_FILE).read_text())
    except (OSError, ValueError):
        return None

"""Where ``analysis fit`` puts its files: whole or not at all. A fit writes into a new folder beside
its output folder and moves it into place only once every file is written (``written_whole``), so
a fit killed mid-write leaves the previous fit as it was, never the new table beside the old plot.

A folder holding nothing but a fit's files (``artifacts/campaigns/NAME/fit``, a new ``--out``) is
replaced whole: the old one renamed aside, the new one renamed in, the old one deleted. A folder the
fit shares with other files (``results/NAME``, with its RESULTS.md and the curves.csv it fits) gets
the new files renamed in one by one under a marker, ``FIT_INCOMPLETE``, removed after the last. What
a killed fit leaves beside the folder (``.NAME.new-PID``, ``.NAME.old-PID``) the next fit puts
right (``tidy``) before it starts."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

# every name a fit writes (analysis.loo, analysis.sizes); a folder of these alone is a fit's own
FIT_NAMES = frozenset(
    {
        "curves.csv",
        "loo_table.csv",
        "loo_table.md",
        "loo_curves.png",
        "extrapolation.csv",
        "runs.md",
        "mechanisms.csv",
        "mechanisms.md",
        "reports",
        "sizes.csv",
        "sizes.md",
        "sizes.json",
        "sizes.png",
    }
)
# the files every fit writes or deliberately leaves out: an earlier fit's are never left beside a new one
REPLACED = frozenset(
    {"loo_table.csv", "loo_table.md", "loo_curves.png", "extrapolation.csv", "sizes.md", "sizes.json", "sizes.png"}
)
INCOMPLETE = "FIT_INCOMPLETE"


@contextlib.contextmanager
def written_whole(out: Path, keep: tuple[str, ...] = ()) -> Iterator[Path]:
    """A new folder to write a fit into, moved into ``out`` once the block ends without an error (removed
    if it raises). ``keep``: names of the previous fit copied in first (``reports``: a run's report is
    not written again)."""
    out = out.resolve()  # a link to a folder: the folder it names
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file, not a folder: name a folder for the fit's files (--out)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tidy(out)
    stage = _sibling(out, "new")
    shutil.rmtree(stage, ignore_errors=True)  # one of this pid's: a killed process's that had it before
    stage.mkdir()
    try:
        for name in keep:
            if (out / name).is_dir():
                shutil.copytree(out / name, stage / name)
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    shared = out.is_dir() and not set(os.listdir(out)) <= FIT_NAMES | {INCOMPLETE}
    if shared or out == Path.cwd() or out in Path.cwd().parents:  # never the working folder renamed away
        _move_in(stage, out)
    else:
        _swap(stage, out)


def _sibling(out: Path, kind: str) -> Path:
    return out.parent / f".{out.name}.{kind}-{os.getpid()}"


def _swap(stage: Path, out: Path) -> None:
    """``stage`` in place of the folder ``out``: a reader sees the old folder whole or the new one."""
    old = _sibling(out, "old")
    if out.exists():
        out.rename(old)  # only once ``stage`` is whole: ``tidy`` takes an old beside a new as a whole new
    stage.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _move_in(stage: Path, out: Path, *, resume: bool = False) -> None:
    """``stage``'s files into ``out``, a folder with other files, under the ``INCOMPLETE`` marker
    (``resume``: the rest of them, after a fit killed while moving them in)."""
    marker = out / INCOMPLETE
    marker.write_text(
        f"A fit was being moved in from {stage} when this was written: if that folder is still there, this"
        " folder mixes two fits; run the fit again.\n"
    )
    for name in set() if resume else REPLACED - set(os.listdir(stage)):
        (out / name).unlink(missing_ok=True)
    for name in sorted(os.listdir(stage)):
        if (out / name).is_dir() and not (out / name).is_symlink():
            _swap(stage / name, out / name)
        else:
            os.replace(stage / name, out / name)
    stage.rmdir()
    marker.unlink()


def tidy(out: Path) -> None:
    """Put right what a fit killed beside ``out`` left: a new folder written whole but not yet moved in
    (its old one set aside) is moved in; a new folder cut short is deleted. Another live fit's are left."""
    out = out.resolve()
    found = {}
    for p in out.parent.glob(f".{out.name}.*-*"):
        m = re.fullmatch(rf"\.{re.escape(out.name)}\.(new|old)-(\d+)", p.name)
        if m and not _alive(int(m[2])):
            found[(m[1], int(m[2]))] = p
    for (kind, pid), p in found.items():
        if kind == "old" and not out.exists():  # killed between its two renames
            new = found.get(("new", pid))
            (new if new is not None else p).rename(out)
        elif kind == "new" and (out / INCOMPLETE).is_file() and str(p) in (out / INCOMPLETE).read_text():
            _move_in(p, out, resume=True)  # killed while moving a whole fit in: the rest of it
    for p in found.values():
        if p.exists():
            shutil.rmtree(p, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

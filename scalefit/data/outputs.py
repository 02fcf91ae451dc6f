"""Where scalefit's commands write: an output path checked before any work (``check_writable``) and
results written as JSON to a file or stdout (``write_json``), whole or not at all (``replace_text``)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from scalefit.errors import FitError


def check_writable(dest: str | os.PathLike | None, option: str) -> None:
    """Refuse, before any work, an output path that cannot be written: an existing file must be
    writable, else its nearest existing folder must take a new file (tried with a temporary file);
    a folder is refused. Leaves nothing behind (folders are made only when the output is written)."""
    if dest is None or str(dest) == "-":
        return
    path = Path(dest)
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    problem = None
    if path.is_dir():
        problem = "it is a folder"
    elif not folder.is_dir():
        problem = f"{folder} is a file, not a folder"
    elif path.exists():
        if not os.access(path, os.W_OK):
            problem = "the file is read-only"
    else:
        try:
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as e:
            problem = f"{folder}: {e.strerror or e}"
    if problem:
        raise FitError(f"{option} {dest}: cannot write there ({problem}); nothing was fitted")


def write_json(payload: dict[str, Any], dest: str | None, *, quiet: bool = False) -> None:
    """``payload`` as JSON to ``dest`` (``-``: stdout; None: nowhere), saying where on stderr unless ``quiet``."""
    if dest is None:
        return
    text = json.dumps(payload, indent=2, default=float)
    if dest == "-":
        print(text)
    else:
        replace_text(Path(dest), text + "\n")
        if not quiet:
            print(f"JSON written to {dest}", file=sys.stderr)


def replace_text(path: Path, text: str) -> None:
    """``text`` as the file ``path``, whole or not at all: written to a new file beside it and renamed
    over it, so a write killed midway leaves the earlier file as it was (and a ``.NAME.PID.tmp``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # the umask's mode, as a new file gets
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)  # the file's own mode kept
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

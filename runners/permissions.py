"""Who may read what the project writes: MLflow stores and run folders are private to their owner
(files 0600, folders 0700), as the tracking server's credential files are, unless ``PRL_GROUP``
names a group to share them with (files 0660, folders 2770 of that group: setgid, so what is
created inside keeps the group).

``restricted()`` sets the process umask for a command (0077, or 0007 with a group), which every
process it starts inherits: SQLite's -journal and -wal files, the artifact folders MLflow creates,
a trainer's checkpoints. ``make_dir`` and ``make_file`` set the mode (and group) of what they
create explicitly, whatever the umask of the process that calls them. Existing files and folders
keep their mode.
"""

from __future__ import annotations

import contextlib
import grp
import os
from collections.abc import Iterator
from pathlib import Path

GROUP_ENV = "PRL_GROUP"


class GroupError(ValueError):
    """``PRL_GROUP`` names a group that does not exist, or one this user cannot give files to."""


def group() -> int | None:
    """The gid of ``PRL_GROUP``, None when it is unset (private); ``GroupError`` for an unknown group."""
    name = os.environ.get(GROUP_ENV, "").strip()
    if not name:
        return None
    try:
        return int(name) if name.isdigit() else grp.getgrnam(name).gr_gid
    except KeyError:
        raise GroupError(
            f"{GROUP_ENV}={name}: no such group; name a group you belong to (id -Gn lists them), "
            f"or unset {GROUP_ENV} to keep stores and run folders private to you"
        ) from None


def umask() -> int:
    """0077 (only the owner), or 0007 when ``PRL_GROUP`` shares with a group."""
    return 0o077 if group() is None else 0o007


@contextlib.contextmanager
def restricted() -> Iterator[None]:
    """The block's umask is ``umask()``; the previous one is restored after it."""
    old = os.umask(umask())
    try:
        yield
    finally:
        os.umask(old)


def _own(path: Path, folder: bool) -> None:
    gid = group()
    if gid is None:
        os.chmod(path, 0o700 if folder else 0o600)
        return
    try:
        os.chown(path, -1, gid)
    except PermissionError:
        raise GroupError(
            f"{GROUP_ENV}={os.environ[GROUP_ENV]}: cannot give {path} to that group (you are not in it); "
            f"name a group you belong to (id -Gn lists them), or unset {GROUP_ENV}"
        ) from None
    os.chmod(path, 0o2770 if folder else 0o660)


def make_dir(path: Path) -> Path:
    """``path`` as a folder, created with its missing parents if needed; each folder created here
    is private (0700), or its group's (2770) under ``PRL_GROUP``. An existing one is left as is."""
    path = Path(path)
    missing = []
    for p in (path, *path.parents):
        if p.is_dir():
            break
        missing.append(p)
    for p in reversed(missing):
        try:
            p.mkdir()
        except FileExistsError:  # made meanwhile by another process: its mode is its maker's
            continue
        _own(p, folder=True)
    return path


def make_file(path: Path) -> bool:
    """Create ``path`` empty (its folder with ``make_dir``), private (0600), or its group's (0660)
    under ``PRL_GROUP``; False if it exists already (left as is)."""
    path = Path(path)
    make_dir(path.parent)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return False
    _own(path, folder=False)
    return True

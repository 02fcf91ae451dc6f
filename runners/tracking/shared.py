"""The shared tracking server (``make tracking-server``): PostgreSQL (a private cluster under ROOT,
unless an existing database is named) and ``mlflow server`` in front of it serving artifacts from
ROOT/artifacts, optionally behind MLflow's basic authentication.

This process owns ROOT while it runs (a lock, and ``tracking-server.json`` naming the owner and
its port): a second start is refused naming the first, and what an owner killed with ``kill -9``
left (its MLflow processes, its PostgreSQL) is stopped before anything starts again.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from runners.tracking.auth import BasicAuth
from runners.tracking.mlflow_server import Stopped, local_server, stop_on_signals, stop_stale_servers
from runners.tracking.postgres import PostgresCluster
from runners.tracking.server_processes import ServerError, check_port, free_port, owner

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class SharedServer:
    """Where and how the shared server runs (``python -m runners tracking-server``'s flags)."""

    root: Path  # pgdata/, artifacts/, auth/ and the owner's record
    db_uri: str | None = None  # an existing database instead of the private PostgreSQL
    host: str = "127.0.0.1"
    port: int = 5001  # MLflow's
    pg_port: int | None = None  # PostgreSQL's (default: a free one)
    workers: int = 4
    auth: bool = False  # MLflow's basic authentication


def run_shared_server(s: SharedServer) -> int:
    """Start PostgreSQL and the MLflow server and serve until Ctrl-C or SIGTERM, which stop both."""
    stop_on_signals()
    if s.host not in LOCAL_HOSTS:
        print(
            f"warning: binding {s.host}: anyone who reaches this port can "
            + ("log in with a user's password" if s.auth else "read and write every run")
            + "; put it behind TLS or an SSH tunnel (docs/operations.md: tracking-server security)",
            file=sys.stderr,
        )
    s.root.mkdir(parents=True, exist_ok=True)
    with _owned(s), contextlib.ExitStack() as stack, contextlib.suppress(Stopped):
        _serve(s, stack)
        while True:
            time.sleep(3600)
    return 0


@contextlib.contextmanager
def _owned(s: SharedServer) -> Iterator[None]:
    """This process owns ROOT (a lock the kernel releases however it ends, and a record naming it);
    a second owner is refused naming the first."""
    record = s.root / "tracking-server.json"
    lock = FileLock(s.root / "tracking-server.lock")
    try:
        owned = lock.acquire(timeout=0)
    except Timeout:
        with contextlib.suppress(OSError, ValueError):
            held = json.loads(record.read_text())
            raise ServerError(
                f"a tracking server of {s.root} runs already (pid {held['owner']}, MLflow port {held['port']}): "
                f"use it, stop it (kill {held['owner']}), or pass another --root"
            ) from None
        raise ServerError(f"a tracking server of {s.root} runs already (it holds {lock.lock_file})") from None
    with owned:
        record.write_text(json.dumps({**owner(), "port": s.port}))
        try:
            yield
        finally:
            record.unlink(missing_ok=True)


def _serve(s: SharedServer, stack: contextlib.ExitStack) -> None:
    """Stop what a killed owner left, check the ports, then start PostgreSQL and MLflow on ``stack``."""
    pg = PostgresCluster(s.root / "pgdata", port=s.pg_port or free_port()) if s.db_uri is None else None
    # nothing else owns ROOT: whatever of it still runs was left by an owner killed with kill -9
    stop_stale_servers(s.db_uri or pg.uri, s.root / "artifacts", log=print)
    if pg is not None:
        pg.stop_leftover(log=print)
    check_port(s.port, s.host, "tracking-server")
    if s.pg_port:
        check_port(s.pg_port, "127.0.0.1", "tracking-server (PostgreSQL)", flag="--pg-port")
    auth = BasicAuth(s.root / "auth").prepare() if s.auth else None
    db = s.db_uri
    if pg is not None:
        db = stack.enter_context(pg).uri
        print(f"PostgreSQL {db} (data {s.root / 'pgdata'})", flush=True)
    url = stack.enter_context(
        local_server(
            db,
            s.root / "artifacts",
            port=s.port,
            host=s.host,
            workers=s.workers,
            auth_env=auth.server_env() if auth else None,
        )
    )
    print(f"MLflow tracking server {url}: export MLFLOW_TRACKING_URI={url}   (Ctrl-C stops it)", flush=True)
    if auth is not None:
        print(
            f"basic authentication on: every request needs a user's password; clients: "
            f"set -a; . {auth.credentials}; set +a   (user {auth.client_env()['MLFLOW_TRACKING_USERNAME']})",
            flush=True,
        )

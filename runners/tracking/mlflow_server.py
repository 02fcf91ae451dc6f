"""A local MLflow server's life cycle: ``serve`` runs an MLflow server command in front of a store
until it answers, records it, and stops its whole process tree on exit; ``local_server`` is
``mlflow server`` (tracking only) that way, for a campaign's concurrent writers, ``make ui`` and the
shared tracking server.

A local server records itself (pid, port, its processes' token, the process that started it) in a
file beside its store; whatever a starter that died without stopping it left (``kill -9`` of a
campaign, of ``make ui`` or of its MLflow main process) is found through the token
(``runners.tracking.server_processes``) and stopped by the next server started for the same store.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil

from runners.tracking import server_processes

#: A server that does tracking only: MLflow's job runner (huey consumers for GenAI features,
#: about eight processes of ~200 MB) stays off.
TRACKING_ONLY = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def server_record(backend_uri: str, artifacts: Path, name: str = "server") -> Path:
    """Where a local server of this store records itself: beside a SQLite file, else in its
    artifacts. ``name``: ``server`` for a campaign's or the tracking server, ``ui-PORT`` for ``make ui``."""
    if backend_uri.startswith("sqlite:///"):
        return Path(backend_uri.removeprefix("sqlite:///") + f".{name}.json")
    return artifacts / f"{name}.json"


def _records(backend_uri: str, artifacts: Path) -> list[Path]:
    """Every server record of this store: its campaign or tracking server and its UIs."""
    first = server_record(backend_uri, artifacts)
    prefix = glob.escape(first.name.removesuffix("server.json"))
    return sorted(p for pattern in ("server.json", "ui-*.json") for p in first.parent.glob(prefix + pattern))


def _legacy_processes(info: dict) -> list[psutil.Process]:
    """The processes of a record written before servers carried a token: the MLflow processes
    of its process group (the server started a session of its own, so the group is its pid)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == info.get("pid") and "mlflow" in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
    return found


def stop_stale_server(record: Path, log=print) -> None:
    """Stop every process of the server a record names (its main process, its uvicorn workers,
    also those a ``kill -9`` of the main process orphaned) if the process that started it is
    gone; a live owner's server is left alone."""
    try:
        info = json.loads(record.read_text())
    except (OSError, ValueError):
        return
    if server_processes.owner_alive(info):
        return
    procs = server_processes.processes(info["token"]) if "token" in info else _legacy_processes(info)
    if procs:
        log(
            f"stopping a stale MLflow server (pid {info.get('pid')}, port {info.get('port')}; processes "
            f"{sorted(p.pid for p in procs)}) left by an interrupted run of this store"
        )
        server_processes.stop(procs)
    record.unlink(missing_ok=True)


def stop_stale_servers(backend_uri: str, artifacts: Path, log=print) -> None:
    """``stop_stale_server`` for every server record of this store."""
    for record in _records(backend_uri, artifacts):
        stop_stale_server(record, log)


class Stopped(BaseException):
    """A Ctrl-C or SIGTERM that stops a server command (``stop_on_signals``). Not a KeyboardInterrupt:
    CPython marks one raised inside a string ``exec`` (dataclasses and namedtuple build their methods
    that way, so any import may) as unhandled for good, and the process then dies of SIGINT (-2, 130)
    on exit, after it was caught and whatever the command returned."""


def stop_on_signals(once: bool = False) -> None:
    """From now on Ctrl-C and SIGTERM raise ``Stopped`` in this process's main thread; ``once``: the
    first one only, later ones are ignored (the stop that the first began is not cut short)."""

    def stop(signum: int, _frame: object) -> None:
        if once:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)


def exit_reason(code: int | None) -> str:
    """'exit code N' or 'killed by SIGNAME', from a Popen return code."""
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def answers(url: str) -> bool:
    """Whether the MLflow server at ``url`` answers ``/health`` with 200 now."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def serve(
    cmd: list[str],
    backend_uri: str,
    artifacts: Path,
    *,
    port: int,
    host: str = "127.0.0.1",
    record_name: str = "server",
    what: str = "mlflow server",
    env: dict[str, str] | None = None,
    out=None,
    log=print,
) -> Iterator[subprocess.Popen]:
    """Run an MLflow server command for a store; yields its main process once ``/health`` answers.

    First stops the servers that killed owners left on the store and refuses a port in use
    (naming the pid that holds it). The server runs in a session of its own, marked and recorded
    (``server_record``) so that a later start finds all of its processes; on exit every process
    of it is stopped, the workers a dead main process left included. ``out``: a file for its
    output (default: this process's)."""
    stop_stale_servers(backend_uri, artifacts, log)
    server_processes.check_port(port, host, what)
    record = server_record(backend_uri, artifacts, record_name)
    record.parent.mkdir(parents=True, exist_ok=True)
    token = server_processes.new_token()
    proc = server_processes.spawn(cmd, token, (os.environ if env is None else env) | TRACKING_ONLY, out)
    main = psutil.Process(proc.pid)
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    try:
        tmp = record.with_suffix(".tmp")
        info = {"pid": proc.pid, "port": port, "token": token, "backend_uri": backend_uri, **server_processes.owner()}
        tmp.write_text(json.dumps(info))
        tmp.replace(record)
        started = said = time.time()
        deadline = started + 120
        log(f"starting {what} on {url} (store {backend_uri}) ...")
        while True:
            if proc.poll() is not None:
                holder = server_processes.port_holder(port, host)
                raise server_processes.ServerError(
                    f"{what} ({exit_reason(proc.returncode)}) stopped before it answered on {url}"
                    + (f"; port {port} is held by {holder}" if holder else "")
                    + (f"; see {getattr(out, 'name', 'its output above')}")
                )
            if answers(url):
                break
            if time.time() > deadline:
                raise server_processes.ServerError(f"{what} did not answer on {url} within 120 s")
            if time.time() - said >= 10:  # a first start creates the store's tables; a loaded machine is slow
                said = time.time()
                log(f"  still starting ({said - started:.0f} s; it answers within 120 s or is stopped)")
            time.sleep(0.5)
        yield proc
    finally:
        server_processes.stop({p.pid: p for p in (main, *server_processes.processes(token))}.values())
        proc.wait()
        with contextlib.suppress(OSError, ValueError):
            if json.loads(record.read_text()).get("token") == token:
                record.unlink()


@contextlib.contextmanager
def local_server(
    backend_uri: str,
    artifacts: Path,
    *,
    port: int | None = None,
    host: str = "127.0.0.1",
    workers: int = 1,
    auth_env: dict[str, str] | None = None,
    log=print,
) -> Iterator[str]:
    """Run ``mlflow server`` (on 127.0.0.1 unless told otherwise) in front of a store; yields its URL.

    In front of SQLite it gives many processes one writer, so none sees "database is locked".
    It runs as one process and its uvicorn worker(s): tracking only (``TRACKING_ONLY``).
    ``auth_env``: the server environment of MLflow's basic authentication (``runners.tracking.auth``);
    every request then needs a user's credentials."""
    port = port or server_processes.free_port()
    artifacts.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        backend_uri,
        "--artifacts-destination",
        str(artifacts.resolve()),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
        *(["--app-name", "basic-auth"] if auth_env else []),
    ]
    started = time.time()
    with (
        (artifacts / "server.log").open("ab") as logf,
        serve(
            cmd,
            backend_uri,
            artifacts,
            port=port,
            host=host,
            env=os.environ | (auth_env or {}),
            out=logf,
            log=log,
            what="an MLflow tracking server",
        ) as proc,
    ):
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
        ready = f"ready in {time.time() - started:.0f} s (pid {proc.pid})"
        log(f"MLflow tracking server {url} (store {backend_uri}) {ready}")
        yield url

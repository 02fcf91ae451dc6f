"""The processes of the servers the project starts (the MLflow of ``make ui``, of a campaign and of
``make tracking-server``): started in a session of their own, found and stopped as a whole tree,
and the port check before any of them starts.

A server's processes carry a marker in their environment (``PRL_SERVER=<token>``) that every
process they start inherits, so a uvicorn worker whose parent was killed with ``kill -9`` (it is
then a child of init, still serving) is found by the token alone. The MLflow main process also
gets SIGTERM when the process that started it dies (Linux's parent-death signal), and passes it
on to its worker. A record file (``mlflow_server.server_record``) names the token and the owner; the
next start for the same store stops whatever a dead owner left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterable

import psutil

from runners.parent_death import parent_death_preexec

MARK = "PRL_SERVER"  # environment variable naming the server a process belongs to


class ServerError(RuntimeError):
    pass


def new_token() -> str:
    return uuid.uuid4().hex


def owner() -> dict:
    """This process as a record's owner: its pid and start time (a reused pid is not the owner)."""
    return {"owner": os.getpid(), "owner_started": psutil.Process().create_time()}


def owner_alive(info: dict) -> bool:
    """Whether the process a record names as its owner is still running (and is that process)."""
    try:
        proc = psutil.Process(info["owner"])
        started = info.get("owner_started")
        return proc.status() != psutil.STATUS_ZOMBIE and (started is None or abs(proc.create_time() - started) < 1)
    except (psutil.Error, KeyError, TypeError):
        return False


def processes(token: str) -> list[psutil.Process]:
    """Every live process of the server marked ``token`` (its main process, workers, orphans)."""
    found = []
    for proc in psutil.process_iter(["environ"]):
        env = proc.info["environ"]  # None where it cannot be read (another user's, a kernel thread)
        if env and env.get(MARK) == token and proc.pid != os.getpid():
            found.append(proc)
    return found


def stop(procs: Iterable[psutil.Process], timeout: float = 20) -> None:
    """SIGTERM to each process, SIGKILL to those still alive after ``timeout`` seconds."""
    procs = list(procs)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        _, procs = psutil.wait_procs(procs, timeout=timeout if sig == signal.SIGTERM else 10)
        if not procs:
            return


def _describe(pid: int | None) -> str:
    if pid is None:
        return "a process of another user (run as root, or `ss -ltnp`, to see which)"
    try:
        cmd = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        cmd = "?"
    return f"pid {pid} ({cmd[:120]})"


def port_holder(port: int, host: str = "127.0.0.1") -> str | None:
    """What listens on ``host:port`` (also on the wildcard address), as 'pid N (command)'; None if free."""
    wildcard = ("0.0.0.0", "::", "")
    for conn in psutil.net_connections("inet"):
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        if conn.laddr.ip == host or conn.laddr.ip in wildcard or host in wildcard or host == "localhost":
            return _describe(conn.pid)
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port(port: int, host: str, what: str, flag: str = "--port") -> None:
    """Refuse to start ``what`` on a port that something already listens on, naming the holder."""
    holder = port_holder(port, host)
    if holder is not None:
        pid = holder.split()[1] if holder.startswith("pid ") else "PID"
        raise ServerError(
            f"{what}: port {port} is in use by {holder}; stop it (kill {pid}) or choose another port ({flag})"
        )


def spawn(cmd: list[str], token: str, env: dict[str, str], out=None) -> subprocess.Popen:
    """Start a server in a session of its own, marked with ``token``; on Linux it gets SIGTERM
    when the thread that started it ends, with its process or alone (so start it from a thread
    that outlives it, as the ``with`` block of ``mlflow_server.serve`` does). ``out``: a file for its
    output (default: this process's)."""
    return subprocess.Popen(
        cmd,
        stdout=out,
        stderr=subprocess.STDOUT if out is not None else None,
        start_new_session=True,
        env=env | {MARK: token},
        preexec_fn=parent_death_preexec(signal.SIGTERM, parent=os.getpid()),
    )

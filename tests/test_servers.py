"""The servers the project starts stop as whole process trees, and a busy port is refused up front
(issue 27, item 4): `make ui` (`python -m runners ui`) whose MLflow process is killed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from runners.tracking.server_processes import free_port
from tests.campaigns import wait_healthy
from tests.conftest import empty_store

REPO = Path(__file__).resolve().parent.parent


def listening(port: int) -> list[int | None]:
    """The pids that listen on ``port`` (None for one this user cannot see)."""
    return [c.pid for c in psutil.net_connections("inet") if c.status == "LISTEN" and c.laddr.port == port]


def start_ui(store: str, port: int, log: Path) -> subprocess.Popen:
    with log.open("a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "runners", "ui", "--tracking-uri", store, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO,
        )


def mlflow_main(pid: int) -> psutil.Process:
    """The ``python -m mlflow ui`` process of a ``runners ui`` (itself, or its child)."""
    top = psutil.Process(pid)
    return next(p for p in (top, *top.children(recursive=True)) if p.cmdline()[1:3] == ["-m", "mlflow"])


@pytest.mark.slow
def test_a_ui_whose_mlflow_process_is_killed_fails_leaves_no_worker_and_restarts_on_its_port(tmp_path, store_template):
    """kill -9 of make ui's mlflow process: its uvicorn worker kept answering /health and the next
    `make ui` on the port logged 'address already in use' and exited 0. Now the UI fails (exit 1)
    and stops its worker; the next one starts on the same port."""
    store, port, log = empty_store(store_template, tmp_path / "mlflow.db"), free_port(), tmp_path / "ui.log"
    ui = start_ui(store, port, log)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", ui)
        # the UI command has seen its server answer (it prints the address): a kill now is one of a
        # started UI, not of a start still polling /health (that one says "stopped before it answered")
        deadline = time.time() + 60
        while f"MLflow UI: http://127.0.0.1:{port}" not in log.read_text() and time.time() < deadline:
            time.sleep(0.1)
        main = mlflow_main(ui.pid)
        tree = [main, *main.children(recursive=True)]
        assert any("uvicorn" in " ".join(p.cmdline()) for p in tree)
        main.kill()
        rc = ui.wait(timeout=60)
        assert rc == 1, log.read_text()
        assert "stopped on its own (killed by SIGKILL)" in log.read_text()
        _, alive = psutil.wait_procs(tree, timeout=10)
        assert alive == [] and listening(port) == []  # no worker left answering
    finally:
        if ui.poll() is None:
            ui.kill()
    again = start_ui(store, port, log)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", again)
        assert MlflowClient(f"http://127.0.0.1:{port}").search_experiments()
        tree = [mlflow_main(again.pid), *mlflow_main(again.pid).children(recursive=True)]
        again.send_signal(signal.SIGTERM)  # as Ctrl-C: a clean stop of the whole tree
        assert again.wait(timeout=60) == 0, log.read_text()
        _, alive = psutil.wait_procs(tree, timeout=10)
        assert alive == [] and listening(port) == []
    finally:
        if again.poll() is None:
            again.kill()


@pytest.mark.parametrize("command", ["ui", "tracking-server"])
def test_a_port_in_use_is_an_error_naming_its_pid(tmp_path, store_template, command):
    """Before, `make ui` on a busy port logged uvicorn's 'address already in use' and exited 0."""
    ui_store = ["--tracking-uri", empty_store(store_template, tmp_path / "mlflow.db")]  # ui makes none unasked
    where = ui_store if command == "ui" else ["--root", str(tmp_path)]
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "runners", command, *where, "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=REPO,
        )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert f"port {port} is in use by pid {os.getpid()} (" in r.stderr and f"kill {os.getpid()}" in r.stderr


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_inside_a_string_exec_still_exits_0(sig):
    """`make ui` stopped with SIGTERM exited -2 (SIGINT) one time in ~40, with no traceback, though it
    returned 0: the signal landed while mlflow's import built a dataclass (a string ``exec``), and
    CPython marks a KeyboardInterrupt raised there as unhandled for good. The handler now raises
    ``Stopped``; a command that catches it exits with what it returns."""
    code = (  # it ends as `python -m runners` does, by returning: sys.exit() would skip CPython's mark
        "from runners.tracking.mlflow_server import Stopped, stop_on_signals\n"
        "stop_on_signals()\n"
        "try:\n"
        f"    exec('import os, signal; os.kill(os.getpid(), signal.{sig})')\n"
        "except Stopped as e:\n"
        "    print('stopped by', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert (r.returncode, r.stdout.strip()) == (0, f"stopped by {sig}"), r.stderr

"""A campaign's tracking server, watched: the local MLflow server a campaign starts in front of its
SQLite store is checked every second by a thread of the campaign. When it dies (``kill -9`` of its
processes, the OOM killer) or stops answering, it is started again on the same store and port, so
the runs carry on: their writes wait in their retries meanwhile (``tracking.run.HTTP_LIMITS`` and
``MlflowSink``). When it cannot be started again, the campaign stops its runs and says why in one
line (``ServerError``): a re-run resumes them from their checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

from runners.tracking import server_processes
from runners.tracking.mlflow_server import local_server, server_record
from runners.tracking.server_processes import ServerError, free_port
from runners.tracking.store import sqlite_file

CHECK_EVERY = 1.0  # seconds between two checks of the server
SILENT_FOR = 30.0  # a server alive but answering nothing this long counts as dead (a loaded one answers in < 2 s)
MAX_RESTARTS = 3  # a server that dies more often than this is not started again: something keeps killing it


class Watched:
    """The campaign's server and its watcher thread's verdict: ``url`` (the same across restarts),
    ``check()`` (raises ``ServerError`` once the server is lost) and ``wait()`` (until it serves or is lost)."""

    def __init__(self, backend_uri: str, artifacts: Path, log: Callable[[str], None]) -> None:
        self.backend_uri, self.artifacts, self.log = backend_uri, artifacts, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.up, self.started, self.stopping = threading.Event(), threading.Event(), threading.Event()
        self.first_error: BaseException | None = None  # the first start's: the campaign never ran
        self.lost: str | None = None  # why it could not be kept: the campaign stops its runs
        self.restarts = 0

    def check(self) -> None:
        """Raise ``ServerError`` (one line naming the fix) if the server is lost."""
        if self.lost is not None:
            raise ServerError(self.lost)

    def wait(self) -> None:
        """Return once the server serves (a restart takes seconds) or is lost (``check`` then raises)."""
        while not self.up.wait(CHECK_EVERY) and self.lost is None:
            pass

    def keep(self) -> None:
        """The watcher thread: serve, watch, start again on a death, until ``stopping`` or lost."""
        try:
            self._keep()
        except ServerError as e:
            if not self.started.is_set():
                self.first_error = e
            else:
                self.lost = _lost(f"the campaign's MLflow tracking server could not be started again: {e}")
        except Exception as e:  # noqa: BLE001 - any other failure of the watcher loses the server, said in one line
            self.first_error = e if not self.started.is_set() else None
            self.lost = _lost(f"the watcher of the campaign's tracking server failed ({type(e).__name__}: {e})")
        finally:
            self.started.set()

    def _keep(self) -> None:
        died_at = 0.0
        while True:
            with local_server(self.backend_uri, self.artifacts, port=self.port, log=self.log):
                pid = json.loads(server_record(self.backend_uri, self.artifacts).read_text())["pid"]
                if died_at:
                    self.log(
                        f"tracking server back on {self.url} (pid {pid}) {time.time() - died_at:.0f} s after it "
                        f"died (restart {self.restarts} of at most {MAX_RESTARTS}): the runs carry on"
                    )
                self.up.set()
                self.started.set()
                why = self._watch(pid)
                self.up.clear()
            if why is None:  # the campaign is over
                return
            died_at = time.time()
            if self.restarts >= MAX_RESTARTS:
                self.lost = _lost(
                    f"the campaign's MLflow tracking server {why}, {MAX_RESTARTS + 1} times in this campaign: "
                    "something keeps killing it",
                    f"see {self.artifacts / 'server.log'} and the kernel's log (dmesg), then ",
                )
                return
            blocker = self._blocker()
            if blocker is not None:
                self.lost = _lost(
                    f"the campaign's MLflow tracking server {why} and cannot be started again: {blocker[0]}", blocker[1]
                )
                return
            self.restarts += 1
            self.log(
                f"the campaign's MLflow tracking server {why}; starting it again on the same store and port "
                "(the runs' writes wait meanwhile)"
            )

    def _watch(self, pid: int) -> str | None:
        """Until the server dies (what happened, as a phrase) or the campaign ends (None)."""
        main = psutil.Process(pid)
        refused, silent_since = 0, None
        while not self.stopping.wait(CHECK_EVERY):
            if not _alive(main):
                return f"(pid {pid}, {self.url}) died"
            state = _probe(self.url)
            refused = refused + 1 if state == "refused" else 0
            silent_since = None if state != "silent" else silent_since or time.time()
            if refused >= 2:
                return f"(pid {pid}) stopped listening on {self.url}"
            if silent_since is not None and time.time() - silent_since >= SILENT_FOR:
                return f"(pid {pid}) answered nothing on {self.url} for {SILENT_FOR:.0f} s"
        return None

    def _blocker(self) -> tuple[str, str] | None:
        """What stands in the way of a restart on the same store and port, and its fix."""
        db = sqlite_file(self.backend_uri)
        if db is not None and not db.is_file():
            return f"its store {db} is gone", "put it back, then "
        holder = server_processes.port_holder(self.port)
        if holder is not None:
            pid = holder.split()[1] if holder.startswith("pid ") else "PID"
            return f"port {self.port}, which its runs write to, is now held by {holder}", f"stop it (kill {pid}), then "
        return None


def _lost(what: str, fix: str = "") -> str:
    """The campaign's one line when its server is lost: what happened, and how to go on."""
    return f"{what}; its runs were stopped: {fix}run the campaign again, they resume from their checkpoints"


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _probe(url: str) -> str:
    """'up' (``/health`` answers 200), 'refused' (nothing listens) or 'silent' (no answer in 2 s, an error)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return "up" if r.status == 200 else "silent"
    except urllib.error.URLError as e:
        return "refused" if isinstance(e.reason, ConnectionRefusedError) else "silent"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "silent"


@contextlib.contextmanager
def watched_server(backend_uri: str, artifacts: Path, *, log: Callable[[str], None] = print) -> Iterator[Watched]:
    """``tracking.mlflow_server.local_server`` for a campaign, kept alive by a watcher thread (which starts it, so
    that it gets the parent-death signal only when the watcher ends); yields a ``Watched`` once it
    serves. A first start that fails raises here, as ``local_server`` would."""
    watched = Watched(backend_uri, artifacts, log)
    thread = threading.Thread(target=watched.keep, name="tracking-server-watch", daemon=True)
    thread.start()
    try:
        watched.started.wait()
        if watched.first_error is not None:
            raise watched.first_error
        yield watched
    finally:
        watched.stopping.set()
        thread.join()

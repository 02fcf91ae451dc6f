"""A campaign's lease on its MLflow store: one campaign at a time per store, seen by every client of
that store, whatever folder it runs from and however the store's URI is spelt (``localhost``
against ``127.0.0.1``, a server in front of a SQLite file against the file itself).

The lease is a tag of the campaign's experiment (``store.LEASE``): who holds it (a random token,
host, pid, the pid's start time, command, since when) and until when. MLflow has no compare-and-set,
so taking it is write, wait ``SETTLE`` seconds, read back: of two clients that both found it free,
the later writer reads back its own token and holds it, the other reads the winner's and is
refused (``locks.Busy``, one line naming the holder). A thread renews it every ``RENEW`` seconds;
one that finds another token there (a racer slower than ``SETTLE``) records it in ``lost`` and
stops renewing, and the campaign stops its runs. A lease not renewed lapses ``TTL`` seconds after
its last renewal (a campaign killed with ``kill -9``, a lost machine); on the holder's own host a
dead holder (its pid gone, a zombie, or reused by another process) is seen at once. The holders'
clocks must agree to well within ``TTL``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import psutil
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from runners.locks import Busy
from runners.tracking import store

TTL = 180.0  # seconds a lease lasts after its last renewal
RENEW = 30.0  # seconds between renewals: five may fail (a server restarting) before it lapses
SETTLE = 2.0  # seconds between writing a lease and reading it back: longer than a racer's read-to-write


def _since(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _command() -> str:
    argv0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    program = "python -m runners" if argv0 == "__main__.py" else f"python {argv0}"
    return " ".join([program, *sys.argv[1:]])[:200]


@dataclass
class Holder:
    """One lease as the tag records it."""

    token: str
    host: str
    pid: int
    started: float  # the pid's process start time: a pid reused by another process is not the holder
    command: str
    since: float
    expires: float

    @classmethod
    def mine(cls, token: str) -> Holder:
        now = time.time()
        me = psutil.Process()
        return cls(token, socket.gethostname(), me.pid, me.create_time(), _command(), now, now + TTL)

    @classmethod
    def parse(cls, text: str | None) -> Holder | None:
        """The holder a tag's text names; None for none (or a tag that is not a lease)."""
        try:
            return cls(**json.loads(text or ""))
        except (ValueError, TypeError):
            return None

    def lapsed(self, now: float | None = None) -> bool:
        """Not renewed for ``TTL`` seconds, or on this host, its process is gone."""
        if (now or time.time()) > self.expires:
            return True
        if self.host != socket.gethostname():
            return False
        try:
            proc = psutil.Process(self.pid)
            return abs(proc.create_time() - self.started) > 1.0 or proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return False

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} ({self.command}, since {_since(self.since)})"


class Lease:
    """The lease of one campaign (``what``) on the store of ``client``: ``take`` it, ``release`` it."""

    def __init__(self, client: MlflowClient, exp_id: str, what: str, advice: str) -> None:
        self.client, self.exp_id, self.what, self.advice = client, exp_id, what, advice
        self.token = secrets.token_hex(8)
        self.lost: str | None = None  # who took it over, when another took it meanwhile
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self) -> Holder | None:
        return Holder.parse(self.client.get_experiment(self.exp_id).tags.get(store.LEASE))

    def _write(self) -> None:
        text = json.dumps(asdict(Holder.mine(self.token)))
        try:
            self.client.set_experiment_tag(self.exp_id, store.LEASE, text)
        except MlflowException:  # a racer inserted the tag first (a UNIQUE constraint): now it is an update
            self.client.set_experiment_tag(self.exp_id, store.LEASE, text)

    def refusal(self, other: Holder) -> Busy:
        return Busy(
            f"{self.what} is in use by {other.describe()}; {self.advice}; if that campaign is dead (killed with "
            f"kill -9, its machine lost), its lease on the store lapses at {_since(other.expires)}: run it again then"
        )

    def take(self) -> None:
        """Hold the lease, renewed in the background, or raise ``Busy`` naming its live holder."""
        other = self.current()
        if other is not None and other.token != self.token and not other.lapsed():
            raise self.refusal(other)
        self._write()
        time.sleep(SETTLE)
        other = self.current()
        if other is None or other.token != self.token:  # a later writer won the race
            raise self.refusal(other) if other is not None else Busy(f"{self.what}: its lease was taken meanwhile")
        self._thread = threading.Thread(target=self._renew, name="campaign-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(RENEW):
            with contextlib.suppress(Exception):  # a server restarting: the next beat tries again
                other = self.current()
                if other is not None and other.token != self.token:
                    self.lost = other.describe()
                    return
                self._write()

    def release(self) -> None:
        """Stop renewing, and remove the lease if it is still this campaign's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(Exception):  # unreachable now: it lapses by itself
            held = self.current()
            if held is not None and held.token == self.token:
                self.client.delete_experiment_tag(self.exp_id, store.LEASE)


@contextlib.contextmanager
def held(client: MlflowClient, exp_id: str, what: str, advice: str) -> Iterator[Lease]:
    """Hold the lease of experiment ``exp_id`` for the block (``Lease.take``), released after it."""
    lease = Lease(client, exp_id, what, advice)
    try:
        lease.take()  # a signal inside it still releases a lease it wrote
        yield lease
    finally:
        lease.release()

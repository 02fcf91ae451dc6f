"""Campaign backends: the interface every scheduler implements (``Backend``: check, start, room,
submit, poll, placement, cancel), the registry of them by name (``register``, ``registered``,
``parse_backend``), the loop that drives any of them (``run_all``), and what they share: a run
ready to start (``Launch``), a run that ended (``Ended``), the tail of a run's log (``tail``) and
where an attempt ran (``note_placement``). A backend's typed settings subclass
``runners.campaign.spec.BackendSettings``, the campaign's section they come from.

A backend registers itself with ``@register``. Every module of this package is a backend, imported
when the registry is first read: the built-in ones (``BUILTIN``: ``local``, ``ray``, ``slurm``)
first, then any other, so a new backend is one module here (plus its test and docs):
``docs/extending.md``.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from runners.campaign.spec import BackendSettings, Campaign, CampaignError, RunSpec

BUILTIN = ("local", "ray", "slurm")  # the built-in backends' modules in this package, loaded first
Failure = tuple[RunSpec, str]  # a run that failed and the tail of its log


@dataclass
class Launch:
    """One run ready to start: its command, the environment naming its MLflow run, its folder."""

    spec: RunSpec
    cmd: list[str]
    env: dict[str, str]
    run_dir: Path


@dataclass
class Ended:
    """A run that ended: done (``ok``), failed (``why``: the tail of its log), or to be started again
    (``again``: it resumes from its checkpoint; ``why`` says what killed it and which retry this is)."""

    spec: RunSpec
    ok: bool
    why: str = ""
    again: bool = False


class Backend(ABC):
    """Who starts a campaign's runs. Each runs ``launch.cmd`` (``python -m runners train``) with
    ``launch.env`` (its MLflow run) for every run it is given, retries a run killed by a signal (it
    resumes from its checkpoint into the same MLflow run) and reports each run's end once."""

    name: ClassVar[str]  # the campaign's ``backend:`` value
    settings_class: ClassVar[type[BackendSettings]]  # its typed settings (``Campaign.backend_settings``)

    def __init__(self, camp: Campaign, log: Callable[[str], None] = print) -> None:
        self.camp, self.log = camp, log
        self.settings: Any = camp.backend_settings

    @abstractmethod
    def check(self) -> None:
        """Refuse (``CampaignError``, naming the set-up) a campaign this backend cannot run from here:
        called before the campaign's lock, MLflow runs or processes exist."""

    def start(self, todo: list[RunSpec], root: Path) -> None:  # noqa: B027 - optional
        """Before the first ``submit``: connect, build the base models ``todo`` shares (once)."""

    def room(self) -> bool:
        """Whether it takes another run now (the local backend has a slot per run)."""
        return True

    @abstractmethod
    def submit(self, launch: Launch) -> None:
        """Start (or queue) one run."""

    @abstractmethod
    def placement(self, launch: Launch) -> str:
        """Where a submitted run goes, for its start line (e.g. ``" on cuda:0"``); each attempt also
        records where it ran (``note_placement``)."""

    @abstractmethod
    def poll(self) -> list[Ended]:
        """Wait up to a few seconds; the runs that ended since the last poll."""

    @abstractmethod
    def cancel(self) -> None:
        """Stop every run it started that has not ended (the campaign was interrupted or cannot go
        on); a re-run resumes them from their checkpoints."""

    def close(self) -> None:  # noqa: B027 - optional
        """After the last poll, or a cancel: undo what ``start`` set up."""


_REGISTRY: dict[str, type[Backend]] = {}
_LOADED: list[bool] = []


def register(cls: type[Backend]) -> type[Backend]:
    """Add a backend to the registry by its ``name``; refused if it leaves a member of ``Backend``
    unimplemented or has no name or settings."""
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    missing += [m for m in ("name", "settings_class") if not hasattr(cls, m)]
    if missing or not issubclass(cls, Backend):
        what = ", ".join(missing) or "a subclass of Backend"
        raise TypeError(f"backend {getattr(cls, 'name', cls.__name__)!r} is incomplete: it needs {what}")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Take the backend ``name`` out of the registry (one registered for a while, as a test's)."""
    _REGISTRY.pop(name, None)


def registered(rescan: bool = False) -> dict[str, type[Backend]]:
    """Every backend by name: the built-in ones and each other module of this package (looked for
    once, or again with ``rescan``: a module added to its folders since)."""
    if rescan:
        _LOADED.clear()
    if not _LOADED:
        others = [m.name for m in pkgutil.iter_modules(__path__) if m.name not in BUILTIN]
        for module in (*BUILTIN, *others):
            importlib.import_module(f"{__name__}.{module}")
        _LOADED.append(True)
    return dict(_REGISTRY)


def campaign_keys() -> set[str]:
    """The top-level campaign keys some backend's settings come from."""
    return {key for b in registered().values() for key in b.settings_class.keys}


def backend_class(name: str) -> type[Backend]:
    """The backend registered as ``name``; else one line listing the registered ones."""
    backends = registered()
    if name not in backends:
        names = sorted(backends)
        choices = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
        raise CampaignError(f"backend = {name!r}; choose {choices}")
    return backends[name]


def parse_backend(name: str, data: dict[str, Any]) -> BackendSettings:
    """The settings of the campaign's backend ``name`` from its top-level mapping ``data``. Keys that
    only another backend reads are checked by that backend (a typo there is a typo still)."""
    chosen = backend_class(name)
    own = set(chosen.settings_class.keys)
    for other in registered().values():
        theirs = set(other.settings_class.keys)
        if other is not chosen and (theirs - own) & set(data):
            other.settings_class.parse({k: data[k] for k in theirs if k in data})
    return chosen.settings_class.parse(data)


def backend_of(camp: Campaign, log: Callable[[str], None] = print) -> Backend:
    """The backend that runs ``camp``, with its settings."""
    return backend_class(camp.backend)(camp, log)


def run_all(
    backend: Backend,
    todo: list[RunSpec],
    prepare: Callable[[RunSpec], Launch],
    root: Path,
    monitor: Callable[[], None] | None = None,
    started: Callable[[], None] | None = None,
) -> list[Failure]:
    """Hand ``todo`` to ``backend`` as it has room (``prepare(spec)`` gives a run its MLflow run and
    command just before it is submitted) until every run has ended; returns the failures with the
    tail of their logs. ``monitor`` is called between polls, ``started`` once the backend has started
    (its base models built) and before the first run; interrupted, the backend cancels its runs."""
    progress = _Progress(backend.log, len(todo))
    queue, failures = list(todo), []
    try:
        if todo:
            backend.start(todo, root)
            if started is not None:
                started()
        while queue or progress.active:
            while queue and backend.room():
                launch = prepare(queue.pop(0))
                backend.submit(launch)
                progress.started(launch.spec, backend.placement(launch))
            ended = backend.poll()
            if monitor is not None:
                monitor()
            for end in ended:
                if progress.ended(end):
                    queue.insert(0, end.spec)
                elif not end.ok:
                    failures.append((end.spec, end.why))
    except BaseException:  # the campaign cannot go on (its tracking server is lost, an interrupt): its runs stop
        backend.cancel()
        raise
    finally:
        backend.close()
    return failures


class _Progress:
    """The campaign's progress lines: ``[k/n] start``, ``retry``, ``done`` and ``FAILED``."""

    def __init__(self, log: Callable[[str], None], total: int) -> None:
        self.log, self.total, self.done, self.active = log, total, 0, 0
        self.retried: set[str] = set()
        self.t0 = time.perf_counter()

    def started(self, spec: RunSpec, where: str) -> None:
        self.active += 1
        verb = "retry" if spec.run_key in self.retried else "start"
        self.log(f"[{self.done + self.active}/{self.total}] {verb} {spec.variant} seed {spec.seed}{where}")

    def ended(self, end: Ended) -> bool:
        """Say how a run ended; True when it is to be submitted again."""
        self.active -= 1
        spec = end.spec
        if end.again:
            self.retried.add(spec.run_key)
            self.log(f"[{self.done + 1}/{self.total}] {spec.variant} seed {spec.seed} {end.why}")
            return True
        self.done += 1
        if end.ok:
            elapsed = time.perf_counter() - self.t0
            self.log(f"[{self.done}/{self.total}] done  {spec.variant} seed {spec.seed}  ({elapsed:.0f} s so far)")
        else:
            last = [x for x in end.why.splitlines() if x.strip()][-1:]
            self.log(f"[{self.done}/{self.total}] FAILED {spec.variant} seed {spec.seed}: {''.join(last)}")
        return False


def tail(path: Path, n: int = 5) -> str:
    """The last ``n`` non-empty lines of a run's log."""
    if not path.is_file():
        return ""
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    return "\n".join(lines[-n:])


def with_gpus(cmd: list[str], gpus: int) -> list[str]:
    """A run's command spread over ``gpus`` GPUs (DDP through accelerate) when it has more than one."""
    return [*cmd, "--gpus", str(gpus)] if gpus > 1 else list(cmd)


def note_placement(env: dict[str, str], log_path: str, where: str) -> None:
    """Say where this attempt of a run runs: a line in its log and its MLflow tag ``prl.placement``."""
    with open(log_path, "a") as f:
        f.write(f"[placement] {where}\n")
    if env.get("MLFLOW_RUN_ID"):
        from mlflow.tracking import MlflowClient

        from runners.tracking import store

        MlflowClient(env["MLFLOW_TRACKING_URI"]).set_tag(env["MLFLOW_RUN_ID"], store.PLACEMENT, where)

"""Running a campaign: its runs' MLflow bookkeeping (an experiment per campaign, a parent run, a
child run per variant x seed with the recipe as params), what is done and what is left, and
handing the rest to the campaign's backend (``runners.campaign.backends``: local processes, Ray tasks
or SLURM jobs).

Re-running is safe: a finished run (same identity) is skipped, an interrupted one resumes from
its checkpoint into the same MLflow run. One process runs a campaign on a store at a time: it
holds the campaign's lease in the store (``_one_campaign``: every client of the store sees it) and,
on a SQLite store, its file lock (``campaign_lock``), and a second is refused naming its pid and
host. A signal (SIGTERM, Ctrl-C) that stops it marks its runs and parent KILLED (``_stopped``).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from runners.campaign import ui
from runners.campaign.backends import Launch, backend_of, run_all
from runners.campaign.backends.local import command, run_folder
from runners.campaign.load import expand, load_campaign, size_budgets
from runners.campaign.spec import BUILD_STRIDE, Campaign, CampaignError, RunSpec, fit_settings, fmt_value
from runners.contract import STOP_FILE
from runners.locks import hold
from runners.permissions import make_dir
from runners.runfolder import has_history, recorded_store, remember_store, set_aside
from runners.task.sizes import parameter_count
from runners.task.weights import base_weights
from runners.tracking import basemodels, lease, store
from runners.tracking.mlflow_server import Stopped
from runners.tracking.run import new_run


def status_of(run: Run | None) -> str:
    if run is None:
        return "to do"
    if store.is_done(run):
        return "done"
    if store.is_stopped(run):
        return "stopped"
    return {"RUNNING": "running", "FAILED": "failed", "KILLED": "failed"}.get(run.info.status, "interrupted")


def run_campaign(
    ref: str | Path,
    *,
    only_axis: str | None = None,
    only_sizes: tuple[str, ...] = (),
    dry_run: bool = False,
    runs_root: Path = Path("artifacts/campaigns"),
    tracking_uri: str | None = None,
    resume_stopped: bool = False,
    new_store: bool = False,
    log=print,
) -> dict[str, Any]:
    """Run every to-do run of a campaign; returns a summary with failures (and, for an adaptive
    campaign, the compute its stops saved). Runs an adaptive campaign stopped stay stopped unless
    ``resume_stopped``: then they continue from their last checkpoint to the full budget.
    ``new_store``: create the SQLite store if it does not exist (``store.store_to_write``), and
    train again into it the runs whose folders hold runs of another store (``_elsewhere``)."""
    camp = load_campaign(ref)
    specs = expand(camp, only_axis, only_sizes)
    decide = not (only_axis or only_sizes)  # an adaptive campaign's stops compare whole arms
    uri = store.canonical_uri(tracking_uri or store.default_tracking_uri())  # one file, one store
    if dry_run:
        return _run_campaign(camp, specs, uri, decide, True, runs_root, resume_stopped, log, new_store=new_store)
    uri = store.store_to_write(uri, new_store=new_store)  # before the lock, which would make its folder
    if (db := store.sqlite_file(uri)) is not None:
        make_dir(db.parent)  # a new store's folder (--new-store): private, or PRL_GROUP's
    check_backend(camp)  # before the lock: a campaign that cannot run leaves nothing behind
    check_folders(camp, specs, runs_root)  # a read-only artifacts/ or base-model cache: likewise
    lock = campaign_lock(camp.name, uri)  # a SQLite store's file lock; every store's lease (``_one_campaign``)
    with hold(lock, f"campaign {camp.name} on store {uri}", ADVICE) if lock else contextlib.nullcontext():
        return _run_campaign(camp, specs, uri, decide, False, runs_root, resume_stopped, log, new_store=new_store)


ADVICE = "wait for it, or stop it and run the campaign again (finished runs are kept, interrupted ones resume)"


def check_backend(camp: Campaign) -> None:
    """Refuse a campaign whose backend is not installed or reachable here, naming the set-up."""
    backend_of(camp).check()


def check_folders(camp: Campaign, specs: list[RunSpec], runs_root: Path) -> None:
    """Refuse a campaign whose folder (its runs' folders and MLflow artifacts), or the cache of a
    base model it has yet to build, takes no file, naming the folder: before its lock, a server
    or an MLflow run (``./mlruns`` included) is made."""
    from runners.runfolder import cache_problem, unwritable

    folder = runs_root / camp.name
    why = unwritable(folder)
    if why is not None:
        raise CampaignError(
            f"cannot write the campaign's folder {folder.absolute()} ({why}); make it writable (its runs' folders "
            "and MLflow artifacts go there), or run the campaign from another folder"
        )
    for spec in specs:
        problem = spec.recipe.model.size and cache_problem(
            spec.recipe.model.size, spec.recipe.data.task, None, spec.recipe.model.build_seed
        )
        if problem:
            raise CampaignError(problem)


def campaign_lock(name: str, uri: str) -> Path | None:
    """The file lock of a campaign on a SQLite store: beside the store's own file (whatever folder the
    campaign is run from, and whatever symlink or ``..`` reaches the file). Any other store has none:
    a file lock is seen only by the clients that share its folder; the lease on the store itself
    (``runners.tracking.lease``, taken by ``_one_campaign``) is seen by all."""
    db = store.sqlite_file(store.canonical_uri(uri))
    return None if db is None else db.with_name(f"{db.name}.{name.replace('/', '-')}.campaign.lock")


def _run_campaign(
    camp: Campaign,
    specs: list[RunSpec],
    uri: str,
    decide: bool,
    dry_run: bool,
    runs_root: Path,
    resume_stopped: bool,
    log,
    *,
    new_store: bool = False,
) -> dict[str, Any]:
    db = store.sqlite_file(uri)
    missing = db is not None and not db.exists()  # no store yet: nothing to read, and --dry-run creates none
    client = None if missing else MlflowClient(uri)
    exp_id = None if client is None else store.experiment_id(client, camp.name)
    existing = store.identified_runs(client, exp_id) if exp_id else {}
    root = runs_root / camp.name
    elsewhere = _elsewhere(specs, existing, root)
    built = f", {camp.builds} builds: seed S of build B is B*{BUILD_STRIDE}+S" if camp.builds > 1 else ""
    log(f"campaign {camp.name}: {len(specs)} runs ({camp.kind}, seeds {camp.seeds}{built}), tracking {uri}")
    for s in specs:
        on = "" if s.build is None else f"  build {s.build}"
        log(f"  {s.variant:<28} seed {s.seed}{on}  id {s.run_key}  {status_of(existing.get(s.run_key))}")
    if camp.kind == "scale":
        for line in size_budgets(specs):
            log(line)
    if dry_run:
        if missing:
            log(f"no MLflow store at {db} yet (--dry-run creates none): {_creates(uri, new_store)}")
        if elsewhere:
            log(_elsewhere_line(camp, elsewhere, uri))
        return {"runs": len(specs), "dry_run": True}
    if elsewhere and not new_store:
        raise CampaignError(_elsewhere_line(camp, elsewhere, uri))
    if store.create_store(uri):
        log(f"created the MLflow store {db} (mode {oct(db.stat().st_mode & 0o7777)[2:]})")
    client = client or MlflowClient(uri)
    exp_id = store.experiment_id(client, camp.name, create=True)
    with _one_campaign(client, exp_id, camp, uri) as held:
        existing = store.identified_runs(client, exp_id)  # again, under the lease: a campaign that held it wrote
        for s, folder in _elsewhere(specs, existing, root):
            was = recorded_store(folder) or "another store"
            aside = set_aside(folder, "other-store")
            log(f"  {s.variant} seed {s.seed}: its folder held a run of {was}; set aside in {aside}, trained again")
        parent = _parent(client, exp_id, camp)
        try:
            if parent.info.status != "RUNNING":  # KILLED, FAILED or FINISHED by an earlier run of the campaign
                client.update_run(parent.info.run_id, status="RUNNING")
            ui.prepare(client, exp_id, parent.info.run_id, camp.name, fit_settings(camp.fit).x)  # opens on curves
            make_dir(root)  # private (0700), or PRL_GROUP's
            tracked = _Tracked(camp, uri, root, client, exp_id, parent, existing, log, lease=held)
            todo, resumed = tracked.to_run(specs, resume_stopped)
            t0 = time.perf_counter()
            failures, saved = tracked.train(specs, todo, decide=decide, resumed=resumed)
        except (Stopped, KeyboardInterrupt) as e:  # its backend has stopped its runs (``run_all``)
            raise _stopped(client, exp_id, parent.info.run_id, camp, e) from None
        client.set_terminated(parent.info.run_id, "FAILED" if failures else "FINISHED")
    return {
        "runs": len(specs),
        "ran": len(todo),
        "failures": failures,
        "seconds": time.perf_counter() - t0,
        "experiment_id": exp_id,
        "parent_run_id": parent.info.run_id,
        "tracking_uri": uri,
        "campaign": camp,
        "adaptive": saved,
    }


@contextlib.contextmanager
def _one_campaign(client: MlflowClient, exp_id: str, camp: Campaign, uri: str) -> Iterator[lease.Lease]:
    """This campaign alone on its store for the block, whatever folder or URI spelling another is run
    with: the lease on the campaign's experiment (``runners.tracking.lease``), taken before any of its
    runs or folders is touched; refused (``locks.Busy``) in one line naming the live holder."""
    with lease.held(client, exp_id, f"campaign {camp.name} on store {store.store_key(uri)}", ADVICE) as held:
        yield held


class CampaignStopped(Exception):
    """A campaign stopped by a signal (SIGTERM, Ctrl-C) after its runs were stopped and marked KILLED;
    the message says what stopped and what a re-run does; ``code`` is the exit status (128 + signal)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def signal_of(e: BaseException) -> str:
    """The signal a ``Stopped`` (or a ``KeyboardInterrupt``) stands for: ``SIGTERM``, ``SIGINT``."""
    return str(e) if isinstance(e, Stopped) and str(e) in signal.Signals.__members__ else "SIGINT"


def stop_code(e: BaseException) -> int:
    """The exit status of a command a signal stopped: 128 + the signal's number (143 for SIGTERM)."""
    return 128 + int(signal.Signals[signal_of(e)])


def _stopped(client: MlflowClient, exp_id: str, parent_id: str, camp: Campaign, e: BaseException) -> CampaignStopped:
    """After a signal stopped the campaign, its backend having stopped its runs: the runs of its
    experiment left RUNNING (what was training, and runs made but not started), and its parent run,
    marked KILLED (a re-run resumes them); the one line that says so."""
    sig = signal_of(e)
    again = "run the campaign again to go on (finished runs are kept, stopped ones resume from their last checkpoint)"
    try:
        running = client.search_runs([exp_id], "attributes.status = 'RUNNING'", max_results=50000)
        names = sorted(r.info.run_name for r in running if r.info.run_id != parent_id)
        for r in running:
            client.set_terminated(r.info.run_id, "KILLED")
        client.set_terminated(parent_id, "KILLED")
    except Exception as err:  # the store is out of reach: the next run of the campaign resumes them all the same
        marked = f"; MLflow could not mark them KILLED ({str(err).splitlines()[0][:120] if str(err) else err!r})"
        names, what = [], "its runs were stopped"
    else:
        marked = ", marked KILLED in MLflow with the campaign's parent run"
        what = f"{len(names)} run(s) stopped ({', '.join(names[:4])}{' ...' if len(names) > 4 else ''})"
        what = what if names else "no run was training"
    return CampaignStopped(f"campaign {camp.name} stopped by {sig}: {what}{marked}; {again}", stop_code(e))


@dataclass
class _Tracked:
    """A campaign ready to train: its store (``client``), experiment, parent run and runs by identity."""

    camp: Campaign
    uri: str
    root: Path
    client: MlflowClient
    exp_id: str
    parent: Run
    existing: dict[str, Run]
    log: Callable[[str], None]
    lease: Any = None  # its lease on the store (``runners.tracking.lease``): lost to another, it stops
    watched: Any = None  # the tracking server in front of a SQLite store (``runners.campaign.watch``)
    monitor: Any = None  # an adaptive campaign's decisions (``runners.campaign.adaptive.Monitor``)
    bases: dict[str, tuple[Path, str | None]] = field(default_factory=dict)  # build -> cache folder, weights used
    weights: dict[str, str] = field(default_factory=dict)  # build -> the weights its runs start from

    def to_run(self, specs: list[RunSpec], resume_stopped: bool) -> tuple[list[RunSpec], set[str]]:
        """The runs not done (nor stopped by an adaptive decision, unless ``resume_stopped``: those are
        resumed), and the variants resumed past their stop (not decided on again)."""
        status = {s.run_key: status_of(self.existing.get(s.run_key)) for s in specs}
        skip = {"done"} if resume_stopped else {"done", "stopped"}
        todo = [s for s in specs if status[s.run_key] not in skip]
        resumed: set[str] = set()
        for s in todo:
            if status[s.run_key] == "stopped":
                (run_folder(self.root, s) / STOP_FILE).unlink(missing_ok=True)
                self.client.set_tag(self.existing[s.run_key].info.run_id, store.STOPPED, "0")
                resumed.add(s.variant)
        n_stopped = 0 if resume_stopped else sum(status[s.run_key] == "stopped" for s in specs)
        self.log(f"{len(specs) - len(todo) - n_stopped} done, {n_stopped} stopped, {len(todo)} to run")
        return todo, resumed

    def train(self, specs: list[RunSpec], todo: list[RunSpec], *, decide: bool, resumed: set[str]) -> tuple:
        """Hand ``todo`` to the campaign's backend; returns its failures and, for an adaptive campaign
        (``decide``: not one axis alone), the compute its stops saved."""
        from runners.campaign.watch import watched_server

        # a server gives the runs one writer in front of SQLite; with none to run, this process is the only one
        # (watched: started again on the same store and port when it dies, ``runners.campaign.watch``)
        sqlite = self.uri.startswith("sqlite:") and todo
        server = watched_server(self.uri, self.root / "mlartifacts", log=self.log) if sqlite else None
        with server if server is not None else contextlib.nullcontext() as self.watched:
            self.worker_uri = self.watched.url if self.watched is not None else self.uri
            self.worker_client = MlflowClient(self.worker_uri)
            if self.camp.adaptive is not None and decide:
                self.monitor = self._monitor(specs, resumed)
            self.find_bases(todo)
            backend = backend_of(self.camp, self.log)
            failures = run_all(backend, todo, self.prepare, self.root, monitor=self.poll, started=self.check_bases)
            return failures, self._saved()

    def find_bases(self, todo: list[RunSpec]) -> None:
        """Before any build: the embedded builds ``todo`` starts from, each with the weights the
        campaign's runs of it started from; a cache that lacks one takes the campaign's logged copy
        (``basemodels.fetch``) rather than building weights of its own."""
        runs = list(self.existing.values())
        for spec in todo:
            path = spec.recipe.base_model()
            if not path or path.name in self.bases:
                continue
            had = basemodels.recorded(self.client, self.parent, runs, path.name)
            self.bases[path.name] = (path, had)
            missing = had is not None and not (path / "build_info.json").is_file()
            if missing and basemodels.fetch(self.client, self.parent.info.run_id, path.name, path, had):
                self.log(
                    f"base model {path.name}: the campaign's own (weights {basemodels.short(had)}), from its store"
                )

    def check_bases(self) -> None:
        """Once the backend has built what was missing, before a run starts: each build's weights here
        are those the campaign's runs used (else one line, ``basemodels.mismatch``); a first use is
        recorded on the parent run and its build logged there for other machines and nodes."""
        parent = self.parent.info.run_id
        for name, (path, had) in self.bases.items():
            if not (path / "build_info.json").is_file():  # built into a node's own cache: its runs check it
                if had is not None:
                    self.weights[name] = had
                continue
            have = base_weights(path)
            if had is not None and have != had:
                raise CampaignError(str(basemodels.mismatch(name, had, have, path)))
            if had is None:
                self.client.set_tag(parent, store.BASE_WEIGHTS_OF + name, have)
                self.log(f"base model {name}: weights {basemodels.short(have)}, recorded for the campaign's runs")
            basemodels.publish(self.client, parent, path)
            self.weights[name] = have

    def serving(self) -> None:
        """A server lost for good ends the campaign: its parent FAILED (in the store), one line."""
        if self.watched is not None:
            self.watched.wait()  # a server being started again serves within seconds
            if self.watched.lost is not None:
                self.client.set_terminated(self.parent.info.run_id, "FAILED")
                self.watched.check()

    def mlflow_run(self, spec: RunSpec) -> Run:
        """The run's MLflow run: resumed if it exists, else a new child."""
        if spec.run_key not in self.existing:
            self.existing[spec.run_key] = _new_child(self.worker_client, self.exp_id, self.parent, self.camp, spec)
        return self.existing[spec.run_key]

    def prepare(self, spec: RunSpec) -> Launch:
        """A run's MLflow run, folder and command, just before its backend starts it."""
        self.serving()
        run_id = self.mlflow_run(spec).info.run_id
        make_dir(run_folder(self.root, spec))
        launch = command(spec, run_id, self.worker_uri, self.root)
        base = spec.recipe.base_model()
        if base is not None and (sha := self.weights.get(base.name)):  # a node whose cache holds other weights
            launch.env[store.EXPECTED_WEIGHTS] = sha  # refuses, and one that lacks them fetches them
        remember_store(launch.run_dir, store.store_key(self.uri), run_id)  # its store, not the server in front
        return launch

    def poll(self) -> None:
        """Between the backend's polls: its lease on the store, the server's health, an adaptive campaign's
        decisions."""
        if self.lease is not None and self.lease.lost is not None:
            raise CampaignError(
                f"campaign {self.camp.name} lost its lease on the store to {self.lease.lost} (two campaigns "
                "started at the same moment); its runs were stopped: let that one finish, then run it again"
            )
        if self.watched is not None and self.watched.lost is not None:
            self.serving()
        if self.monitor is not None:
            self.monitor()

    def _monitor(self, specs: list[RunSpec], resumed: set[str]) -> Any:
        from runners.campaign.adaptive import Monitor

        members: dict[str, list] = {}
        for spec in specs:  # every run of the campaign gets its MLflow run now: decisions need them all
            members.setdefault(spec.variant, []).append(
                (self.mlflow_run(spec).info.run_id, run_folder(self.root, spec), float(spec.recipe.planned_samples))
            )
        return Monitor(self.camp.adaptive, self.worker_client, members, log=self.log, exempt=resumed)

    def _saved(self) -> dict[str, float] | None:
        """The adaptive campaign's last decisions and the compute its stops saved (logged to the parent)."""
        if self.monitor is None:
            return None
        self.monitor(force=True)
        saved = self.monitor.saved()
        self.log(
            f"adaptive: {len(self.monitor.stopped)} variant(s) stopped; compute not spent: "
            f"{saved['samples_saved']:.0f} completions ({saved['share_saved']:.0%} of the campaign), "
            f"~{saved['device_hours_saved']:.3f} device-hours"
        )
        for k, v in saved.items():
            self.worker_client.log_metric(self.parent.info.run_id, f"adaptive/{k}", v)
        return saved


def _creates(uri: str, new_store: bool) -> str:
    """What the campaign would do about a store that does not exist (``store.store_to_write``)."""
    try:
        store.store_to_write(uri, new_store=new_store)
    except store.StoreError as e:
        return f"the campaign would refuse: {e}"
    return "the campaign creates it"


def _elsewhere(specs: list[RunSpec], existing: dict[str, Run], root: Path) -> list[tuple[RunSpec, Path]]:
    """The runs whose folder holds results (evaluations, checkpoints, its end) of an MLflow run this
    store does not have: tracked in another store. Re-tracked from those folders they would be
    runs marked done with a fraction of their metrics."""
    return [(s, f) for s in specs if s.run_key not in existing and has_history(f := run_folder(root, s))]


def _elsewhere_line(camp: Campaign, elsewhere: list[tuple[RunSpec, Path]], uri: str) -> str:
    """One line: which folders hold runs of which other store (or of this one, since replaced or
    emptied), and the ways on."""
    stores = {recorded_store(f) or "" for _, f in elsewhere} - {""}
    others = sorted(stores - {store.store_key(uri)})
    folders = f"the run folder {elsewhere[0][1]}" + (f" and {len(elsewhere) - 1} more" if len(elsewhere) > 1 else "")
    again = f"pass {store.NEW_STORE} to train them again into this store (their files are set aside in each folder)"
    if stores and not others:  # recorded here: the store was replaced or emptied since
        return (
            f"campaign {camp.name}: {folders} hold(s) runs tracked in this store, {uri}, which no longer has "
            f"them (replaced or emptied?): put it back, or copy them in from a copy (make import SRC=COPY), or {again}"
        )
    where = f"the store {', '.join(others)}" if others else "another store"
    src = store.sqlite_file(others[0]) if len(others) == 1 else None
    return (
        f"campaign {camp.name}: {folders} hold(s) runs tracked in {where}, not in {uri}: point MLFLOW_TRACKING_URI "
        f"at that store, or copy its runs here first (make import SRC={src or 'THAT_STORE'}), or {again}"
    )


def child_run(client: MlflowClient, camp: Campaign, spec: RunSpec) -> Run:
    """The MLflow run of one of a campaign's runs: found by its identity, else created as the
    campaign would create it (parent, tags, params)."""
    exp_id = store.experiment_id(client, camp.name, create=True)
    found = store.identified_runs(client, exp_id).get(spec.run_key)
    if found is not None:
        return found
    return _new_child(client, exp_id, _parent(client, exp_id, camp), camp, spec)


def _new_child(client: MlflowClient, exp_id: str, parent: Run, camp: Campaign, spec: RunSpec) -> Run:
    tags = _campaign_tags(camp, spec, parent)
    return new_run(client, exp_id, spec.recipe, name=spec.name, run_key=spec.run_key, tags=tags)


def _parent(client: MlflowClient, exp_id: str, camp: Campaign) -> Run:
    found = store.parent_run(client, exp_id)
    if found:
        return found
    run = client.create_run(exp_id, run_name=camp.name, tags={store.KIND: "campaign", store.CAMPAIGN: camp.name})
    client.log_text(run.info.run_id, camp.path.read_text(), "campaign.yaml")
    return run


def _campaign_tags(camp: Campaign, spec: RunSpec, parent: Run) -> dict[str, str]:
    sized = {store.SIZE: spec.value, store.PARAMETERS: str(parameter_count(spec.value))} if camp.kind == "scale" else {}
    return {
        **sized,
        "mlflow.parentRunId": parent.info.run_id,
        store.CAMPAIGN: camp.name,
        store.VARIANT: spec.variant,
        store.AXIS: spec.axis or "",
        store.VALUE: fmt_value(spec.value) if spec.axis else "",
        store.SEED: str(spec.seed),
    }

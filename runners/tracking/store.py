"""The MLflow contract: the tag and metric names runs are written and read by, and the few
queries everyone needs (the default store, a campaign's runs and its parent run, a metric's
history as a pandas Series), and which store a run writes into: one file is one store whatever
path reaches it (``canonical_uri``), and a new store is made only where asked for
(``store_to_write``, ``create_store``).

Runners write through these names and analysis reads through them; no other module spells a
``prl.*`` tag. The metric names are ``runners.contract``'s.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pandas as pd
from mlflow.entities import Param, Run
from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.uri import is_local_uri

from runners.permissions import make_dir, make_file
from runners.runfolder import SQLITE_FULL, full_disk

DEFAULT_STORE = "mlflow.db"

# Tags of a run (child of a campaign, or a single tracked run).
RUN_ID = "prl.run_id"  # the run's identity: hash of the resolved recipe and the code identity
DONE = "prl.done"  # "1" once training finished and its files are logged
CAMPAIGN = "prl.campaign"
VARIANT = "prl.variant"  # "baseline", "loss=dapo", "control=lr_half", ...
AXIS = "prl.axis"
VALUE = "prl.value"
SEED = "prl.seed"
SIZE = "prl.size"  # a scale campaign's run: its embedded model size ("nano", "large", ...)
PARAMETERS = "prl.parameters"  # and that size's parameter count
CODE_VERSION = "prl.code_version"
GIT_COMMIT = "prl.git_commit"
VERSIONS = "prl.versions"
BEST_STEP = "prl.best_step"
RUN_DIR = "prl.run_dir"  # a single run's folder (part of its identity: the folder is what resumes)
REPORT = "prl.report"  # artifact path of the run's written report
STOPPED = "prl.stopped"  # "1": an adaptive campaign stopped the run at a checkpoint (not done)
STOP_DECISION = "prl.stop_decision"  # why, in words and numbers
DECISION_PREFIX = "prl.decision."  # + percent of the budget: the decision taken there (JSON)
ABANDONED_FOR = "prl.abandoned_for"  # a run that could not be resumed: the run that replaced it
ABANDONED_REASON = "prl.abandoned_reason"
PLACEMENT = "prl.placement"  # where the run's latest attempt ran: a Ray node, a SLURM job and host
IMPORTED_FROM = "prl.imported_from"  # a copied run's source run id: a second import skips it
READING = "prl.reading"  # set by `analysis fit`: slower or lower than the baseline (scalefit.forecasts.slower_or_lower)
P_WITHIN = "prl.p_within"  # set by `analysis fit`: P(its seeds' mean at the forecast's target lands within ±margin)
UNSTABLE = "prl.unstable"  # set by `analysis fit`: where the run left its sibling seeds (scalefit.data.unstable)
BASE_MODEL = "prl.base_model"  # the embedded build a run starts from (``size-buildkey``), or its model.path
BASE_WEIGHTS = "prl.base_weights"  # the sha256 of the weights it starts from (``runners.task.weights``)
BASE_WEIGHTS_OF = (
    "prl.base_weights."  # + build name, on a campaign's parent run: the weights its runs of that build use
)
BASE_MODELS_DIR = (
    "base-models"  # a campaign parent run's artifacts: each build it uses, whole (``tracking.basemodels``)
)
EXPECTED_WEIGHTS = "PRL_BASE_WEIGHTS"  # a campaign's run's environment: the weights it must start from
# MLflow's own experiment tag for which view its UI opens: training runs, not GenAI traces.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
# Tags of a campaign's parent run.
KIND = "prl.kind"  # "campaign"
# Tag of a campaign's experiment.
LEASE = "prl.lease"  # the campaign running on the store now, and until when (``runners.tracking.lease``)


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else a SQLite file in the working directory (MLflow's default backend)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(DEFAULT_STORE).resolve()}"


class StoreError(ValueError):
    """A tracking URI to read from that names no MLflow store."""


def sqlite_file(uri: str) -> Path | None:
    """The file of a ``sqlite:///`` URI as written (relative to the working folder if relative), else None."""
    return Path(uri.removeprefix("sqlite:///").split("?")[0]) if uri.startswith("sqlite:///") else None


def existing_store(uri: str) -> str:
    """``uri`` unchanged when there is a store to read: a ``sqlite:///`` path must be an SQLite file
    holding MLflow's tables. MLflow itself would create an empty store at a mistyped path (and
    report no runs), or migrate any other SQLite file into one."""
    if is_local_uri(uri) and not MLFLOW_ALLOW_FILE_STORE.get():  # a path: MLflow's retired file store
        raise StoreError(not_a_tracking_uri(uri))
    path = sqlite_file(uri)
    if path is None:
        return uri  # a server or database: its own errors name it
    if not path.is_file():
        raise StoreError(
            f"no MLflow store at {path} (no such file): run a campaign first (make ablation), or name the store"
            " with --tracking-uri or MLFLOW_TRACKING_URI"
        )
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as e:
        raise StoreError(f"{path} is not an MLflow store: not an SQLite database ({e})") from None
    if not {"experiments", "runs", "metrics"} <= tables:
        raise StoreError(f"{path} is not an MLflow store: an SQLite database without MLflow's tables")
    return uri


NEW_STORE = "--new-store"  # the flag that asks for a store where there is none


def canonical_uri(uri: str) -> str:
    """The URI of the store's own file: a ``sqlite:///`` path resolved (symlinks, ``..``, a relative
    path), so that one file is one store whatever path reached it; any other URI unchanged."""
    path = sqlite_file(uri)
    if path is None:
        return uri
    query = uri.partition("?")[2]
    return f"sqlite:///{path.resolve()}" + (f"?{query}" if query else "")


def store_key(uri: str) -> str:
    """What a run folder records as its store: the canonical URI, without a password."""
    parts = urlsplit(canonical_uri(uri))
    if parts.password is None:
        return canonical_uri(uri)
    host = parts.hostname or ""
    netloc = f"{parts.username}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def store_to_write(uri: str, *, new_store: bool = False) -> str:
    """The canonical URI of the store a run or a campaign writes into. A SQLite file that does not
    exist is refused (``StoreError``: one line naming the path and ``--new-store``) unless it is
    the project's default store (``./mlflow.db``) or ``new_store`` asks for it: MLflow would
    create a store at a mistyped path. Nothing is created here (``create_store`` does)."""
    if is_local_uri(uri) and not MLFLOW_ALLOW_FILE_STORE.get():  # a path: MLflow's retired file store
        raise StoreError(not_a_tracking_uri(uri))
    canon = canonical_uri(uri)
    path = sqlite_file(canon)
    if path is None or path.exists() or new_store or path == Path(DEFAULT_STORE).resolve():
        return canon
    folder = "" if path.parent.is_dir() else f", and its folder {path.parent} does not exist"
    raise StoreError(
        f"no MLflow store at {path}{folder}: check the path (MLFLOW_TRACKING_URI), or pass {NEW_STORE} "
        "to create a new store there"
    )


def create_store(uri: str) -> bool:
    """Create the SQLite store of ``uri`` (and its folder) if missing, private to its owner
    (``runners.permissions``: 0600, or PRL_GROUP's 0660; SQLite gives its journal files the same mode),
    with MLflow's tables. True if it was created. A store that cannot be made whole (its disk fills,
    an interrupt) is removed with what this call made for it (its folders, SQLite's journal), so no
    half-made store is taken for one later; a full disk is one line (``StoreError``: ``disk full:``)."""
    path = sqlite_file(uri)
    if path is None or path.exists():
        return False
    made = [p for p in (path.parent, *path.parent.parents) if not p.exists()]  # the folders this call makes
    make_file(path)
    try:
        MlflowClient(uri).search_experiments(max_results=1)  # MLflow makes its tables and default experiment
    except BaseException as e:
        for leftover in (path, *(path.with_name(f"{path.name}{x}") for x in ("-journal", "-wal", "-shm"))):
            leftover.unlink(missing_ok=True)
        for folder in made:  # innermost first
            with contextlib.suppress(OSError):
                folder.rmdir()
        why = full_disk(e, path.parent, (SQLITE_FULL,)) if isinstance(e, Exception) else None
        if why is None:
            raise
        raise StoreError(
            f"disk full: {why}; the half-made store {path} was removed: free space there, or put the store on "
            "another disk (MLFLOW_TRACKING_URI), then run again"
        ) from None
    return True


def damage(path: Path) -> str | None:
    """What SQLite finds broken in the file at ``path`` (None when nothing): not a database, or a
    page ``PRAGMA quick_check`` cannot read (it reads every page: ~1.3 s for 300 MiB). A store
    another process holds locked, or one this user cannot open, is not called broken."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            found = [row[0] for row in db.execute("PRAGMA quick_check(1)")]
    except sqlite3.OperationalError:
        return None  # locked, or unreadable: MLflow's own error names it
    except sqlite3.DatabaseError as e:
        return str(e)
    lines = [x for line in found for x in line.splitlines() if x and not x.startswith("***")]
    return None if found == ["ok"] else "; ".join(lines)[:200]


def check_store(uri: str) -> None:
    """An existing SQLite store must be whole before a command writes to it or serves it
    (``StoreError`` naming the file and what to do); MLflow would die in an 83-line traceback.
    A missing or empty file, or a server, is left to the commands that create or reach it."""
    path = sqlite_file(uri)
    if path is None or not path.is_file() or path.stat().st_size == 0:
        return
    problem = damage(path)
    if problem is not None:
        raise StoreError(
            f"the MLflow store {path} is corrupt (SQLite: {problem}); restore it from a backup, or move it aside "
            f"to start a new store (mv {path} {path}.corrupt)"
        )


def not_a_tracking_uri(uri: str) -> str:
    """Why a path is no tracking URI (MLflow would take it for its retired file store and raise),
    and what to pass instead: the sqlite:/// URI of an SQLite file, --curves for a CSV."""
    path = Path(uri.removeprefix("file://").removeprefix("file:"))
    store = "sqlite:///PATH" if path.suffix == ".csv" else f"sqlite:///{path.resolve()}"
    curves = f"to fit a curves.csv, pass it as --curves {path}; " if path.suffix == ".csv" else ""
    return f"{uri} is not a tracking URI: {curves}name an SQLite store as {store} or a server as http://HOST:PORT"


def log_params(client: MlflowClient, run_id: str, params: dict[str, str]) -> None:
    """Log a run's params in MLflow's batches of at most 100."""
    batch = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(batch), 100):
        client.log_batch(run_id, params=batch[i : i + 100])


def read_client(tracking_uri: str | None = None) -> MlflowClient:
    """A client on a store that exists (``tracking_uri``, else the default), to read runs from."""
    return MlflowClient(existing_store(tracking_uri or default_tracking_uri()))


def experiment_id(client: MlflowClient, name: str, *, create: bool = False) -> str | None:
    """The experiment of a campaign (one per campaign), created if asked, marked as one of training
    runs so MLflow's UI opens its runs and charts (not the GenAI traces view). The local folder a
    new experiment keeps its artifacts in (``./mlruns/ID`` beside a SQLite store) is made private
    at once, as the store is (``runners.permissions``)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if create and not exp.tags.get("mlflow.experimentKind"):
            for k, v in EXPERIMENT_KIND.items():
                client.set_experiment_tag(exp.experiment_id, k, v)
        return exp.experiment_id
    if not create:
        return None
    try:
        new = client.create_experiment(name, tags=EXPERIMENT_KIND)
    except MlflowException as e:  # another client created it since: theirs is the one
        if e.error_code != "RESOURCE_ALREADY_EXISTS" or (exp := client.get_experiment_by_name(name)) is None:
            raise
        return exp.experiment_id
    location = client.get_experiment(new).artifact_location
    if location.startswith(("/", "file:")):
        make_dir(Path(location.removeprefix("file://").removeprefix("file:")))
    return new


def runs_by_identity(client: MlflowClient, exp_id: str) -> dict[str, list[Run]]:
    """Every run of an experiment that carries an identity, by identity, oldest first: more than one
    where a kill inside ``run.start_over`` left two, or two campaigns trained the same run."""
    runs = client.search_runs(
        [exp_id], filter_string=f"tags.`{RUN_ID}` != ''", max_results=50000, order_by=["attributes.start_time ASC"]
    )
    found: dict[str, list[Run]] = {}
    for r in runs:
        found.setdefault(r.data.tags[RUN_ID], []).append(r)
    return found


def chosen_run(runs: list[Run]) -> Run:
    """Which of one identity's runs (oldest first) stands for it: the newest finished one, else the
    newest; never an arbitrary one."""
    done = [r for r in runs if is_done(r)]
    return (done or runs)[-1]


def identified_runs(client: MlflowClient, exp_id: str) -> dict[str, Run]:
    """The runs of an experiment that carry an identity, by identity; where one identity has
    several (``runs_by_identity``), the ``chosen_run``."""
    return {key: chosen_run(runs) for key, runs in runs_by_identity(client, exp_id).items()}


def parent_run(client: MlflowClient, exp_id: str) -> Run | None:
    """A campaign's parent run, if it has one yet."""
    found = client.search_runs([exp_id], filter_string=f"tags.`{KIND}` = 'campaign'", max_results=1)
    return found[0] if found else None


def is_stopped(run: Run | None) -> bool:
    return run is not None and run.data.tags.get(STOPPED) == "1"


def is_done(run: Run | None) -> bool:
    return run is not None and run.data.tags.get(DONE) == "1"


def history(client: MlflowClient, run_id: str, key: str) -> pd.Series:
    """A metric's full history, indexed by step (the last value logged at a step wins)."""
    hist = client.get_metric_history(run_id, key)
    return pd.Series({m.step: m.value for m in hist}, dtype=float).sort_index()

"""A tracked run: its MLflow run (a new one carries the run's identity and provenance as tags and
its flattened recipe as params; a single run finds its own again, ``single_run``), the metric sink
it logs through (deduplicated by step, so a resumed run never records a step twice), training inside
it (``tracked_train``), and a run that starts over under a new identity (``start_over``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

from mlflow.entities import Metric, Run
from mlflow.tracking import MlflowClient

from runners.contract import MEAN_AT_16
from runners.identity import code_version, run_key
from runners.recipe import Recipe
from runners.runfolder import RunFolderError, has_history, recorded_store, remember_store, set_aside
from runners.tracking import basemodels, store

#: A trainer's MLflow HTTP calls, bounded through MLflow's own settings (its defaults: 7 retries,
#: backoff factor 2, 120 s timeout, about 4 min a call against a server that is gone; with the
#: sink's 8 attempts a run blocked silently for 39 min). Now a call gives up after about 60 s
#: (retries after 0, 2, 4, 8, 16 and 32 s), long enough for a campaign to start its dead server again
#: (``runners.campaign.watch``); the sink says each failure on the console. The environment overrides them.
HTTP_LIMITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "6",  # twice the 31 s a restart took under load
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


def http_limits() -> dict[str, str]:
    """``HTTP_LIMITS``, each unless this process's environment sets it already."""
    return {k: os.environ.get(k, v) for k, v in HTTP_LIMITS.items()}


def request_error(e: Exception) -> str:
    """An MLflow client error in one short line: the request and its root cause
    (``API request to URL failed: [Errno 111] Connection refused``), not urllib3's whole chain."""
    text = (str(e).splitlines() or [type(e).__name__])[0]
    head, sep, cause = text.partition(" failed with exception ")
    if not sep:
        return text[:200]
    if "Caused by " in cause:  # urllib3's chain: the innermost reason is last
        cause = cause.rsplit("Caused by ", 1)[1].rsplit(": ", 1)[-1].rstrip("'\")")
    return f"{head} failed: {cause[:160]}"


class MlflowSink:
    """Logs metric dicts at a step into one MLflow run; steps already present are skipped.

    A write the tracking server refuses for a moment (many packed runs on one SQLite store: the
    server's connection pool runs dry, "QueuePool limit ... reached") is retried with backoff for
    about two minutes before the run fails: 13 of 25 runs of the loo-gpu3 study died of one such
    refusal before this.
    """

    RETRY_DELAYS = (1, 2, 4, 8, 15, 30, 60)  # seconds between attempts

    def __init__(self, client: MlflowClient, run_id: str, log=print) -> None:
        self.client, self.run_id, self.log = client, run_id, log
        self.last_train_step = max((m.step for m in client.get_metric_history(run_id, "train/loss")), default=-1)
        self.val_steps = {m.step for m in client.get_metric_history(run_id, MEAN_AT_16)}

    def backfill(self, records: list[dict]) -> int:
        """Log the evaluations the run's ``metrics.jsonl`` holds (``runners.rl.train.metric_records``)
        and the MLflow run lacks (a run that died between writing its record and logging it: a
        resume would otherwise skip that evaluation for good); returns how many."""
        missing = [r for r in records if r["step"] not in self.val_steps]
        for r in missing:
            self({k: v for k, v in r.items() if k != "step"}, r["step"])
        if missing:
            self.log(
                f"logged {len(missing)} evaluation(s) the run had recorded but MLflow had not: steps "
                f"{[r['step'] for r in missing]}"
            )
        return len(missing)

    def _log_batch(self, batch: list) -> None:
        from mlflow.exceptions import MlflowException
        from requests.exceptions import RequestException

        for attempt, delay in enumerate((*self.RETRY_DELAYS, None), start=1):
            try:
                self.client.log_batch(self.run_id, metrics=batch, synchronous=True)
                return
            except (MlflowException, RequestException) as e:
                if delay is None:
                    raise
                self.log(f"tracking server refused a write ({request_error(e)}); retry {attempt} in {delay} s")
                time.sleep(delay)

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        is_val = MEAN_AT_16 in metrics
        if (is_val and step in self.val_steps) or (not is_val and step <= self.last_train_step):
            return
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 500):
            self._log_batch(batch[i : i + 500])
        if is_val:
            self.val_steps.add(step)
        else:
            self.last_train_step = step


def start_over(client: MlflowClient, run_id: str, run_dir: Path, reason: str, log=print) -> str:
    """A run with history and nothing whole to resume from starts over under a new identity: its
    files move to ``run_dir/abandoned-<time>/``, its MLflow run is ended as FAILED and loses its
    identity tag (kept, tagged with the run that replaced it), and a new MLflow run with the same
    name, parent, tags and params takes its place. Returns the new run's id."""
    old = client.get_run(run_id)
    keep = {k: v for k, v in old.data.tags.items() if not k.startswith("mlflow.") or k in ("mlflow.parentRunId",)}
    new = client.create_run(old.info.experiment_id, run_name=old.info.run_name, tags=keep)
    # the identity moves at once: a kill from here on leaves one run with it (the new one); a kill
    # before this line leaves two, which store.identified_runs resolves to the newest
    client.delete_tag(run_id, store.RUN_ID)
    store.log_params(client, new.info.run_id, old.data.params)
    aside = run_dir / f"abandoned-{time.strftime('%Y%m%d-%H%M%S')}"
    aside.mkdir()
    for name in ("metrics.jsonl", "samples.jsonl", "checkpoints", "best", "done.json"):
        if (run_dir / name).exists():
            (run_dir / name).rename(aside / name)
    client.set_tag(run_id, store.ABANDONED_FOR, new.info.run_id)
    client.set_tag(run_id, store.ABANDONED_REASON, reason[:4000])
    client.set_terminated(run_id, "FAILED")
    log(f"{reason}: starting it over as MLflow run {new.info.run_id}; the old files are in {aside}")
    return new.info.run_id


def tracked_train(recipe, run_dir: Path, log=print) -> dict:
    """``runners.rl.train.train`` inside the MLflow run named by ``MLFLOW_RUN_ID``.

    System metrics are on; the run's files (metrics, recipe, best checkpoint record, sample
    completions) become artifacts, the samples also an MLflow table; the done tag marks a
    finished run. A run that cannot be resumed without splicing its history starts over as a
    new MLflow run (``start_over``). Its written report is analysis's job (``python -m analysis
    report``, or ``analysis fit`` for every run of a campaign).
    """
    import mlflow

    from runners.rl.train import ResumeError, metric_records, train

    os.environ.update(http_limits())  # this process is the trainer: its MLflow calls give up in ~30 s
    client = MlflowClient()
    run_id = os.environ["MLFLOW_RUN_ID"]
    basemodels.tag_run(client, run_id, *basemodels.ready(client, run_id, recipe, log=log))  # before any step
    try:
        with mlflow.start_run(run_id=run_id, log_system_metrics=True):
            sink = MlflowSink(client, run_id, log=log)
            sink.backfill(metric_records(run_dir / "metrics.jsonl"))
            final = train(recipe, run_dir, sinks=[sink], log=log)
    except ResumeError as e:
        run_id = start_over(client, run_id, run_dir, e.reason, log=log)
        with mlflow.start_run(run_id=run_id, log_system_metrics=True):
            final = train(recipe, run_dir, sinks=[MlflowSink(client, run_id, log=log)], log=log)
    with mlflow.start_run(run_id=run_id):
        for name in ("metrics.jsonl", "recipe.yaml", "samples.jsonl", "best/best.json"):
            if (run_dir / name).is_file():
                mlflow.log_artifact(str(run_dir / name))
        samples = samples_table(run_dir / "samples.jsonl")
        logged = {a.path for a in client.list_artifacts(run_id)}
        if samples is not None and "samples_table.json" not in logged:  # log_table appends to a logged one
            mlflow.log_table(samples, artifact_file="samples_table.json")
        best = run_dir / "best" / "best.json"
        if best.is_file():
            mlflow.set_tag(store.BEST_STEP, json.loads(best.read_text())["step"])
        if "stopped_at_step" in final:  # ended early by an adaptive campaign: kept, not done
            mlflow.set_tag(store.STOPPED, "1")
        else:
            mlflow.set_tag(store.STOPPED, "0")
            mlflow.set_tag(store.DONE, "1")
    final["run_id"] = run_id
    return final


def samples_table(path: Path):
    """``samples.jsonl`` as a DataFrame, one row per shown completion (step, prompt, answer,
    completion), for MLflow's table view; None when there is none."""
    if not path.is_file():
        return None
    import pandas as pd

    records = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line a kill or a full disk cut short
            records.append(json.loads(line))
    rows = [{"step": r["step"], **sample} for r in records for sample in r.get("samples", [])]
    return pd.DataFrame(rows) if rows else None


def new_run(client: MlflowClient, exp_id: str, recipe: Recipe, *, name: str, run_key: str, tags: dict[str, str]) -> Run:
    """An MLflow run for a recipe: its identity and provenance as tags, the flattened recipe as params."""
    provenance = {
        store.RUN_ID: run_key,
        store.CODE_VERSION: code_version(),
        store.GIT_COMMIT: _git_commit(),
        store.VERSIONS: _versions(),
    }
    run = client.create_run(exp_id, run_name=name, tags={**provenance, **tags})
    store.log_params(client, run.info.run_id, {k: str(v)[:6000] for k, v in recipe.flat().items()})
    return run


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).resolve().parent
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _versions() -> str:
    from importlib.metadata import version

    return ",".join(f"{p}={version(p)}" for p in ("torch", "transformers", "trl", "mlflow"))


def single_run(recipe: Recipe, run_dir: Path, experiment: str, new_store: bool = False) -> tuple[str, bool]:
    """The MLflow run of a single tracked run: the one of the same identity and run folder (it
    resumes, as the folder does), else a new one; and whether it is done. A store is created only
    where asked for (``store.store_to_write``); a folder whose run is tracked in another store is
    refused, or with ``new_store`` set aside and trained again. The folder records its store."""
    uri = store.store_to_write(store.default_tracking_uri(), new_store=new_store)
    db = store.sqlite_file(uri)
    client = None if db is not None and not db.exists() else MlflowClient(uri)
    exp_id = None if client is None else store.experiment_id(client, experiment)
    folder = str(run_dir.resolve())
    key = run_key(recipe, run_dir=folder)
    run = store.identified_runs(client, exp_id).get(key) if exp_id else None
    held = recorded_store(run_dir) if run is None and has_history(run_dir) else None
    if held not in (None, store.store_key(uri)):
        if not new_store:
            raise RunFolderError(
                f"{folder} holds a run tracked in the store {held}, not in {uri}: point MLFLOW_TRACKING_URI at "
                f"that store, or copy its runs here first (make import SRC={store.sqlite_file(held) or held}), or "
                f"pass {store.NEW_STORE} to train it again into this store (its files are set aside in the folder)"
            )
        print(f"{folder} held a run of {held}; set aside in {set_aside(run_dir, 'other-store')}", flush=True)
    store.create_store(uri)
    client = client or MlflowClient(uri)
    exp_id = store.experiment_id(client, experiment, create=True)
    if run is None:
        name = f"{recipe.name}/seed{recipe.train.seed}"
        run = new_run(client, exp_id, recipe, name=name, run_key=key, tags={store.RUN_DIR: folder})
    remember_store(run_dir, store.store_key(uri), run.info.run_id)
    return run.info.run_id, store.is_done(run)

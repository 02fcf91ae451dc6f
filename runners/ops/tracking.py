"""MLflow tracking: the default SQLite store, a local tracking server for concurrent writers,
and the metric sink that runs log through (deduplicated by step, so a resumed run never
records a step twice).

A local server (a campaign's, ``make ui``, ``make tracking-server``) records itself (pid, port,
its processes' token, the process that started it) in a file beside its store; whatever a
starter that died without stopping it left (``kill -9`` of a campaign, of ``make ui`` or of its
MLflow main process) is found through the token (``runners.ops.servers``) and stopped by the
next server started for the same store.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from runners.contract import MEAN_AT_16
from runners.ops import servers, store

#: A server that does tracking only: MLflow's job runner (huey consumers for GenAI features,
#: about eight processes of ~200 MB) stays off.
TRACKING_ONLY = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}

#: A trainer's MLflow HTTP calls, bounded through MLflow's own settings (its defaults: 7 retries,
#: backoff factor 2, 120 s timeout, about 4 min a call against a server that is gone; with the
#: sink's 8 attempts a run blocked silently for 39 min). Now a call gives up after about 60 s
#: (retries after 0, 2, 4, 8, 16 and 32 s), long enough for a campaign to start its dead server again
#: (``runners.ops.watch``); the sink says each failure on the console. The environment overrides them.
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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    if servers.owner_alive(info):
        return
    procs = servers.processes(info["token"]) if "token" in info else _legacy_processes(info)
    if procs:
        log(
            f"stopping a stale MLflow server (pid {info.get('pid')}, port {info.get('port')}; processes "
            f"{sorted(p.pid for p in procs)}) left by an interrupted run of this store"
        )
        servers.stop(procs)
    record.unlink(missing_ok=True)


def stop_stale_servers(backend_uri: str, artifacts: Path, log=print) -> None:
    """``stop_stale_server`` for every server record of this store."""
    for record in _records(backend_uri, artifacts):
        stop_stale_server(record, log)


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
    servers.check_port(port, host, what)
    record = server_record(backend_uri, artifacts, record_name)
    record.parent.mkdir(parents=True, exist_ok=True)
    token = servers.new_token()
    proc = servers.spawn(cmd, token, (os.environ if env is None else env) | TRACKING_ONLY, out)
    main = psutil.Process(proc.pid)
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    try:
        tmp = record.with_suffix(".tmp")
        info = {"pid": proc.pid, "port": port, "token": token, "backend_uri": backend_uri, **servers.owner()}
        tmp.write_text(json.dumps(info))
        tmp.replace(record)
        started = said = time.time()
        deadline = started + 120
        log(f"starting {what} on {url} (store {backend_uri}) ...")
        while True:
            if proc.poll() is not None:
                holder = servers.port_holder(port, host)
                raise servers.ServerError(
                    f"{what} ({exit_reason(proc.returncode)}) stopped before it answered on {url}"
                    + (f"; port {port} is held by {holder}" if holder else "")
                    + (f"; see {getattr(out, 'name', 'its output above')}")
                )
            if answers(url):
                break
            if time.time() > deadline:
                raise servers.ServerError(f"{what} did not answer on {url} within 120 s")
            if time.time() - said >= 10:  # a first start creates the store's tables; a loaded machine is slow
                said = time.time()
                log(f"  still starting ({said - started:.0f} s; it answers within 120 s or is stopped)")
            time.sleep(0.5)
        yield proc
    finally:
        servers.stop({p.pid: p for p in (main, *servers.processes(token))}.values())
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
    ``auth_env``: the server environment of MLflow's basic authentication (``runners.ops.auth``);
    every request then needs a user's credentials."""
    port = port or free_port()
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

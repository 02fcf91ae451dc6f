"""Copy campaigns between MLflow stores: bring a store made on another machine (a GPU box, a
cluster node) into the local one, runs, parent/child structure, params, tags, full metric
histories and artifacts included. Re-importing is safe: runs already copied are skipped.
"""

from __future__ import annotations

from pathlib import Path

from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

from runners.tracking.store import IMPORTED_FROM, log_params


def _artifact_dir(artifact_uri: str, artifacts_root: Path | None) -> Path | None:
    """Local folder of a source run's artifacts: ``mlflow-artifacts:/`` URIs resolve under ``artifacts_root``."""
    if artifact_uri.startswith("mlflow-artifacts:/"):
        return None if artifacts_root is None else artifacts_root / artifact_uri.removeprefix("mlflow-artifacts:/")
    path = Path(artifact_uri.removeprefix("file://"))
    if not path.is_dir() and artifacts_root is not None:  # a path on the other machine: same layout under root
        path = artifacts_root.joinpath(*path.parts[-3:])  # <experiment id>/<run id>/artifacts
    return path if path.is_dir() else None


def import_store(
    source_uri: str,
    dest_uri: str,
    *,
    artifacts_root: Path | None = None,
    experiments: list[str] | None = None,
    log=print,
) -> dict[str, int]:
    """Copy every run of the named experiments (default: all but 'Default') from source to dest."""
    src, dst = MlflowClient(source_uri), MlflowClient(dest_uri)
    counts = {"runs": 0, "skipped": 0, "metrics": 0}
    for exp in src.search_experiments():
        if (experiments and exp.name not in experiments) or (not experiments and exp.name == "Default"):
            continue
        target = dst.get_experiment_by_name(exp.name)
        exp_id = target.experiment_id if target else dst.create_experiment(exp.name)
        done = {
            r.data.tags[IMPORTED_FROM]: r.info.run_id
            for r in dst.search_runs([exp_id], filter_string=f"tags.`{IMPORTED_FROM}` != ''", max_results=50000)
        }
        runs = src.search_runs([exp.experiment_id], max_results=50000)
        runs.sort(key=lambda r: "mlflow.parentRunId" in r.data.tags)  # parents first
        for run in runs:
            if run.info.run_id in done:
                counts["skipped"] += 1
                continue
            tags = {k: v for k, v in run.data.tags.items() if k != "mlflow.parentRunId"}
            parent = run.data.tags.get("mlflow.parentRunId")
            if parent is not None:
                tags["mlflow.parentRunId"] = done.get(parent, parent)
            tags[IMPORTED_FROM] = run.info.run_id
            new = dst.create_run(exp_id, start_time=run.info.start_time, tags=tags, run_name=run.info.run_name)
            new_id = new.info.run_id
            log_params(dst, new_id, run.data.params)
            for key in run.data.metrics:
                hist = [
                    Metric(m.key, m.value, m.timestamp, m.step) for m in src.get_metric_history(run.info.run_id, key)
                ]
                for i in range(0, len(hist), 1000):
                    dst.log_batch(new_id, metrics=hist[i : i + 1000])
                counts["metrics"] += len(hist)
            folder = _artifact_dir(run.info.artifact_uri, artifacts_root)
            if folder is not None and folder.is_dir():
                dst.log_artifacts(new_id, str(folder))
            dst.set_terminated(new_id, status=run.info.status, end_time=run.info.end_time)
            dst.log_batch(new_id, tags=[RunTag(IMPORTED_FROM, run.info.run_id)])
            done[run.info.run_id] = new_id
            counts["runs"] += 1
        log(f"{exp.name}: {counts['runs']} run(s) imported, {counts['skipped']} already present")
    return counts

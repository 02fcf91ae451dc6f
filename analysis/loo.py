"""From a campaign in MLflow to the paper's LOO table, in parts a reader can name and test alone:
load (``analysis.curves``) → fit (``analysis.fits``, one parsed ``FitSettings``) → table
(``analysis.table``) → render (``analysis.render``) → log (here: ``write_fit`` writes the files,
``write_report`` reads the store, tags the runs and logs the files to the campaign's parent run).

The campaign's fit settings arrive parsed (a ``FitSettings``, parsed once where the campaign loads)
and go down whole: every function reads the one object it is given. The parts' entry points are
importable from here too, as ``python -m analysis fit`` and the notebook (analysis/loo.ipynb) use them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from analysis import builds
from analysis.curves import bad_points, load_curves, read_curves, steady_points
from analysis.fits import HALF_RESAMPLES, Model, campaign_model
from analysis.render import plot_campaign, report_folder, runs_markdown, to_markdown
from analysis.table import SHORT_COLUMNS, calls, extrapolation_check, fit_table, measured_at_budget
from scalefit.forecasts.settings import FitSettings

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

# MLflow (analysis.evidence, runners.tracking.store) is imported where a store is read: a fit from a
# curves.csv (``write_fit``) needs none of it: ~1.5 s of CPU of that fit (make bench-analysis)

__all__ = [
    "Model",
    "bad_points",
    "calls",
    "campaign_model",
    "extrapolation_check",
    "fit_table",
    "load_curves",
    "measured_at_budget",
    "plot_campaign",
    "read_curves",
    "tag_unstable",
    "to_markdown",
    "write_fit",
    "write_missing_reports",
    "write_report",
]


def write_missing_reports(curves: pd.DataFrame, client: MlflowClient, out: Path, log=print) -> int:
    """Each finished run gets its report under ``out/reports/`` (``report_folder``): one written
    earlier and logged to the run is copied from there, and a run without one gets one written
    (``analysis.report``) and logged to it; a report that fails is named, and the rest go on.
    Returns how many were written."""
    from analysis.report import write_run_report
    from runners.tracking import store

    written = 0
    ended = curves["done"] | (curves["stopped"].fillna("") != "") if "stopped" in curves else curves["done"]
    for run_id, g in curves[ended].groupby("run_id", sort=False):
        folder = report_folder(out, g["variant"].iloc[0], g["seed"].iloc[0])
        if (folder / "report.md").is_file():
            continue
        if client.get_run(run_id).data.tags.get(store.REPORT):
            _copy_logged_report(client, run_id, folder)
            continue
        try:
            write_run_report(run_id, folder, tracking_uri=client.tracking_uri)
            written += 1
        except Exception as e:  # noqa: BLE001 - one run's plots must not stop the campaign's table
            log(f"warning: no report for run {run_id} ({type(e).__name__}: {e})")
    if written:
        log(f"run reports: {written} written into the fit's reports/ and logged to their runs")  # not ``out``:
        # the fit is written into a folder of its own first (``analysis.outputs``), renamed into place after
    return written


def _copy_logged_report(client: MlflowClient, run_id: str, folder: Path) -> None:
    """A run's logged report (artifacts ``report/``) into ``folder``, complete or not at all."""
    import os
    import shutil
    import tempfile
    from unittest import mock

    from mlflow.artifacts import download_artifacts

    folder.parent.mkdir(parents=True, exist_ok=True)
    # without its progress bar: MLflow draws one per download on stderr, a screenful on every re-fit
    quiet = mock.patch.dict(os.environ, {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"})
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp, quiet:
        got = download_artifacts(run_id=run_id, artifact_path="report", dst_path=tmp, tracking_uri=client.tracking_uri)
        shutil.rmtree(folder, ignore_errors=True)
        Path(got).rename(folder)


def write_fit(curves: pd.DataFrame, out: Path, settings: FitSettings, title: str = "") -> pd.DataFrame:
    """From curves (as ``load_curves`` or a published ``curves.csv`` holds them): the LOO table
    (CSV + Markdown), the plot with both bands, and the extrapolation check, under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    half = campaign_model(curves, settings, HALF_RESAMPLES, fraction=0.5)
    table, extra = fit_table(curves, settings, half=half)
    table.drop(columns=[c for c in SHORT_COLUMNS if c in table]).to_csv(out / "loo_table.csv", index=False)
    (out / "loo_table.md").write_text(to_markdown(table))
    plot_campaign(curves, extra, out / "loo_curves.png", settings, title)
    extrapolation_check(curves, settings, model=half).to_csv(out / "extrapolation.csv", index=False)
    if builds.mixed(curves) is not None:  # several base models: each variant by build, with their spread
        (out / "builds.md").write_text(builds.markdown(curves, settings=settings))
    return table


def _tag_runs(curves: pd.DataFrame, client: MlflowClient, key: str, values: dict[tuple[str, int], str]) -> None:
    """Each run (one per variant and seed) gets ``values[(variant, seed)]`` as its MLflow tag ``key``;
    a run with none loses the tag an earlier fit gave it."""
    for (variant, seed), run_id in curves.groupby(["variant", "seed"])["run_id"].first().items():
        if (variant, seed) in values:
            client.set_tag(run_id, key, values[(variant, seed)][:5000])
        elif key in client.get_run(run_id).data.tags:
            client.delete_tag(run_id, key)


def _tag_variants(curves: pd.DataFrame, client: MlflowClient, key: str, values: dict[str, str]) -> None:
    """Every run of each variant gets ``values[variant]`` as its MLflow tag ``key`` (``_tag_runs``)."""
    runs = curves[["variant", "seed"]].drop_duplicates().itertuples(index=False)
    _tag_runs(curves, client, key, {(v, s): values[v] for v, s in runs if v in values})


def tag_unstable(curves: pd.DataFrame, client: MlflowClient) -> None:
    """Each flagged run gets its flag as the MLflow tag ``store.UNSTABLE`` (the Flag's text); a run
    flagged by an earlier fit and steady now loses it."""
    from runners.tracking import store

    _tag_runs(curves, client, store.UNSTABLE, {(f.variant, f.seed): f.text() for f in steady_points(curves)[1]})


def tag_readings(curves: pd.DataFrame, table: pd.DataFrame, client: MlflowClient) -> None:
    """Each variant's runs get its reading at the budget as the MLflow tag ``store.READING``
    ("slower, ceiling not yet told: ..."); a variant with none now loses an earlier one."""
    from runners.tracking import store

    readings = {}
    if "reading" in table:
        read = table[table["reading"].apply(lambda v: isinstance(v, str) and bool(v))]
        readings = {r["variant"]: f"{r['reading']}: {r['reading_text']}" for _, r in read.iterrows()}
    _tag_variants(curves, client, store.READING, readings)


def tag_p_within(curves: pd.DataFrame, table: pd.DataFrame, client: MlflowClient) -> None:
    """Each variant's runs get its forecast's P(within ±margin) as the MLflow tag ``store.P_WITHIN``
    ("0.55"); a variant with none (no fit, no band) loses an earlier one."""
    from runners.tracking import store

    values = {}
    if "p_within" in table:
        known = table[table["p_within"].notna()]
        values = {r["variant"]: f"{float(r['p_within']):.3f}" for _, r in known.iterrows()}
    _tag_variants(curves, client, store.P_WITHIN, values)


def write_report(
    campaign: str,
    out: Path,
    settings: FitSettings,
    tracking_uri: str | None = None,
    parent_run_id: str | None = None,
    log=print,
    current: set[str] | None = None,
    partial: bool = False,
) -> pd.DataFrame:
    """Curves CSV, LOO table (CSV + Markdown), plot, extrapolation check and runs list from MLflow;
    logged to the campaign's parent run and its readings tagged on the runs, unless ``partial`` (a
    campaign whose runs have not all finished: its fit is no campaign's result). ``current``: as
    ``load_curves``."""
    from analysis import evidence
    from runners.tracking import store

    out.mkdir(parents=True, exist_ok=True)
    curves = load_curves(campaign, tracking_uri, current, log=log)
    if (mixed := builds.mixed(curves)) is not None:
        log(f"warning: {mixed}")
    curves.to_csv(out / "curves.csv", index=False)
    table = write_fit(curves, out, settings, title=campaign)
    client = store.read_client(tracking_uri)
    if not partial:
        tag_unstable(curves, client)
        tag_readings(curves, table, client)
        tag_p_within(curves, table, client)
    write_missing_reports(curves, client, out, log=log)
    (out / "runs.md").write_text(runs_markdown(curves, out))
    identical = set(table.loc[table["identical_to_baseline"], "variant"]) if "identical_to_baseline" in table else set()
    mechanisms = evidence.acted(evidence.mechanism_runs(curves, client), identical)
    mechanisms.to_csv(out / "mechanisms.csv", index=False)
    (out / "mechanisms.md").write_text(evidence.to_markdown(mechanisms))
    if partial:
        return table
    if parent_run_id is None:
        parent = store.parent_run(client, store.experiment_id(client, campaign))
        parent_run_id = parent.info.run_id if parent else None
    if parent_run_id:
        names = ("curves.csv", "loo_table.csv", "loo_table.md", "loo_curves.png", "extrapolation.csv", "runs.md")
        for name in (*names, "mechanisms.md", "mechanisms.csv"):
            if (out / name).is_file():
                client.log_artifact(parent_run_id, str(out / name), "loo")
    return table

"""What MLflow's UI opens on: a campaign's training runs with mean@16 plotted against compute.

MLflow 3's UI starts a fresh browser in its GenAI view: its workflow switch defaults to GenAI
(a ``workflowType`` URL parameter overrides it for the page, a click on the switch for the
browser), and with the switch on, an experiment's ``mlflow.experimentKind`` tag no longer decides
the view. The runs table nests a campaign's runs under its parent run, collapsed, and its charts
plot each metric against the step, ten runs at most.

So each campaign's experiment carries a saved view (the experiment tag
``mlflow.sharedViewState.<key>``, the UI's "saved views", also opened by its ``viewStateShareKey``
URL parameter): the campaign's runs (those with a variant; the parent run holds the LOO table,
plot and run list under ``loo/``) listed flat by name, every one drawn, and a first section of
charts with mean@16 and pass@16 against the campaign's compute axis. ``campaign_url`` is the
address that opens it, in the training-runs workflow, in chart mode. The experiment's description,
shown above its runs, links the parent run's LOO table and plot. (MLflow's assistant panel opens
on a first visit to a local server whatever the address says; one click closes it for good.)

``open_ui`` is ``make ui``: ``mlflow ui`` over the store (``runners.tracking.mlflow_server``), with the
address of each campaign's curves.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

from mlflow.tracking import MlflowClient

from runners.campaign.load import load_campaign
from runners.campaign.spec import CampaignError, fit_settings
from runners.contract import COMPUTE_METRICS, MEAN_AT_16, PASS_AT_16
from runners.tracking import store
from runners.tracking.mlflow_server import TRACKING_ONLY, Stopped, exit_reason, serve, stop_on_signals
from runners.tracking.server_processes import ServerError

VIEW_KEY = "prl-curves"  # the saved view's id: tag mlflow.sharedViewState.prl-curves, URL viewStateShareKey=
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
SECTION = "prl-loo-curves"  # uuid of the chart section the view opens with
CHILD_RUNS = f"tags.`{store.VARIANT}` != ''"  # a campaign's runs, not its parent: listed flat, none collapsed
# metrics every run logs (their chart sections are known before the first run logs anything)
NOTE = "mlflow.note.content"  # MLflow's description of an experiment (Markdown, shown above its runs)
DESCRIPTION_START = "**The LOO fit**"  # how a description this module wrote begins
RUN_METRICS = (MEAN_AT_16, *COMPUTE_METRICS, "train/loss", "train/time/x", "train/memory/x", "system/x")


def _line_chart(uuid: str, metric: str, x: str, title: str) -> dict:
    """A line chart card as MLflow's UI stores it (``RunsChartsLineCardConfig``): ``metric`` against
    the metric ``x``, every run drawn, points marked."""
    return {
        "uuid": uuid,
        "type": "LINE",
        "runsCountToCompare": 1000,
        "metricSectionId": SECTION,
        "deleted": False,
        "isGenerated": False,
        "displayName": title,
        "metricKey": metric,
        "selectedMetricKeys": [metric],
        "lineSmoothness": 0,
        "xAxisScaleType": "linear",
        "scaleType": "linear",
        "range": {},
        "xAxisKey": "metric",
        "selectedXAxisMetricKey": x,
        "displayPoints": True,
        "yAxisKey": "metric",
        "yAxisExpressions": [],
        "ignoreOutliers": False,
        "useGlobalXaxisKey": False,
        "useGlobalLineSmoothing": False,
    }


def section_name(metric: str) -> str:
    """The chart section MLflow's UI files a metric's chart under (``extractChartSectionName``)."""
    if metric.startswith("system/"):
        return "System metrics"
    return metric.rpartition("/")[0] or "Model metrics"


def view_state(x: str, metrics: Iterable[str] = ()) -> dict:
    """The runs page's state for a campaign fitted against compute axis ``x``: search facets (the
    campaign's runs by name) and UI state (every run shown; the curves' section first, two charts
    a row; the sections of the other ``metrics`` the runs log, and of those every run logs,
    collapsed after it)."""
    label = x.split("/")[-1]
    others = sorted({section_name(m) for m in (*RUN_METRICS, *metrics)})
    return {
        "searchFilter": CHILD_RUNS,
        "orderByKey": "tags.`mlflow.runName`",
        "orderByAsc": True,
        "runsHiddenMode": "SHOW_ALL",  # the default draws the first 10 runs only
        "compareRunSections": [
            {
                "uuid": SECTION,
                "name": "LOO curves",
                "display": True,
                "isReordered": True,
                "columns": 2,
                "cardHeight": 420,
            },
            *({"uuid": f"prl-{name}", "name": name, "display": False, "isReordered": True} for name in others),
        ],
        "compareRunCharts": [
            _line_chart("prl-mean-at-16", MEAN_AT_16, x, f"mean@16 vs {label}"),
            _line_chart("prl-pass-at-16", PASS_AT_16, x, f"pass@16 vs {label}"),
        ],
        "isAccordionReordered": True,  # sections the UI adds for other metrics go after this one
        "hideEmptyCharts": True,
        "globalLineChartConfig": {"xAxisKey": "metric", "selectedXAxisMetricKey": x, "lineSmoothness": 0},
    }


def save_view(client: MlflowClient, exp_id: str, x: str) -> None:
    """Tag the experiment with the campaign's saved view (replacing an earlier one of this key), its
    sections named after the metrics a run of it has logged so far."""
    logged = client.search_runs([exp_id], CHILD_RUNS, max_results=1)
    metrics = logged[0].data.metrics if logged else {}
    now = int(time.time() * 1000)
    envelope = {"name": "LOO curves (mean@16 vs compute)", "createdAt": now, "updatedAt": now}
    envelope["state"] = json.dumps(view_state(x, metrics))
    client.set_experiment_tag(exp_id, VIEW_TAG, json.dumps(envelope))


def describe(client: MlflowClient, exp_id: str, parent_run_id: str, name: str, x: str) -> None:
    """The experiment's description (shown above its runs) links the parent run's fitted LOO table
    and plot; a description someone else wrote is left alone."""
    exp = client.get_experiment(exp_id)
    if not exp.tags.get(NOTE, DESCRIPTION_START).startswith(DESCRIPTION_START):
        return
    art = f"#/experiments/{exp_id}/runs/{parent_run_id}/artifacts/loo"
    ml = "?workflowType=machine_learning"
    client.set_experiment_tag(
        exp_id,
        NOTE,
        f"{DESCRIPTION_START} (`make fit`): [table]({art}/loo_table.md{ml}), [plot]({art}/loo_curves.png{ml}),"
        f" [run reports]({art}/runs.md{ml}); in the artifacts of the parent run {name}. Below: mean@16 against {x}.",
    )


def prepare(client: MlflowClient, exp_id: str, parent_run_id: str, name: str, x: str) -> None:
    """Make a campaign's experiment open on its curves: the saved view and the description."""
    save_view(client, exp_id, x)
    describe(client, exp_id, parent_run_id, name, x)


def campaign_url(base: str, exp_id: str) -> str:
    """The address that lands a fresh browser on a campaign's curves: its runs page in the
    training-runs workflow, chart mode, with the saved view applied."""
    query = urllib.parse.urlencode(
        {"workflowType": "machine_learning", "compareRunsMode": "CHART", "viewStateShareKey": VIEW_KEY}
    )
    return f"{base.rstrip('/')}/#/experiments/{exp_id}/runs?{query}"


def campaign_views(client: MlflowClient, base: str) -> list[tuple[str, str]]:
    """(experiment name, URL) of every campaign in a store, newest first; a campaign recorded
    before views existed (or imported) gets its view now, against the compute axis its campaign
    file fits on (``compute/samples`` when there is no such file)."""
    found = []
    for exp in client.search_experiments(order_by=["last_update_time DESC"]):
        parent = store.parent_run(client, exp.experiment_id)
        if parent is None:
            continue  # not a campaign (single runs: experiment 'runs')
        try:
            x = fit_settings(load_campaign(exp.name).fit).x
        except CampaignError:  # no such campaign file here (made elsewhere, or by a test)
            x = _view_x(exp.tags.get(VIEW_TAG)) or fit_settings(None).x
        prepare(client, exp.experiment_id, parent.info.run_id, exp.name, x)
        found.append((exp.name, campaign_url(base, exp.experiment_id)))
    return found


def _view_x(tag: str | None) -> str | None:
    """The compute axis of a saved view (None when there is none, or it is not ours)."""
    try:
        return json.loads(json.loads(tag)["state"])["globalLineChartConfig"]["selectedXAxisMetricKey"]
    except (TypeError, ValueError, KeyError):
        return None


def open_ui(uri: str, port: int, first: str | None = None, *, new_store: bool = False) -> int:
    """``mlflow ui`` over the store, after the servers killed runs left on it are stopped; its
    whole process tree stops with it (Ctrl-C, SIGTERM: 0), and it fails (1) if the UI stops on its own.
    ``first``: the campaign whose address is listed first. A store that does not exist is created
    only where asked for (``store.store_to_write``): ``mlflow ui`` would make one at a mistyped path."""
    if uri.startswith(("http://", "https://")):
        raise ServerError(f"{uri} is a tracking server: it serves its own UI, open it in a browser")
    uri = store.store_to_write(uri, new_store=new_store)
    store.check_store(uri)  # a corrupt store: one line, not the UI's own traceback
    store.create_store(uri)  # a new one (the default, or --new-store): private, or PRL_GROUP's
    stop_on_signals()  # Ctrl-C and SIGTERM alike
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--workers", "1"]
    try:
        with serve(
            [*cmd, "--port", str(port)],
            uri,
            Path("artifacts"),
            port=port,
            record_name=f"ui-{port}",
            what="the MLflow UI",
            env=os.environ | TRACKING_ONLY,
        ) as proc:
            print(f"MLflow UI: http://127.0.0.1:{port}  (store {uri}; Ctrl-C stops it)", flush=True)
            print_campaign_urls(uri, f"http://127.0.0.1:{port}", first)
            code = proc.wait()
    except Stopped:
        return 0
    print(
        f"error: the MLflow UI (pid {proc.pid}) stopped on its own ({exit_reason(code)}); so did its workers",
        file=sys.stderr,
    )
    return 1


def print_campaign_urls(uri: str, base: str, first: str | None = None) -> None:
    """The address of each campaign's curves in the UI, ``first`` first."""
    try:
        views = campaign_views(MlflowClient(store.existing_store(uri)), base)
    except store.StoreError:
        views = []
    if first:  # a campaign file's path or name: its experiment is named after the file's `name`
        with contextlib.suppress(CampaignError):
            first = load_campaign(first).name
        views.sort(key=lambda v: v[0] != first)
    if not views:
        print("  no campaign in this store yet: make ablation runs one", flush=True)
    for name, url in views:
        print(f"  campaign {name}, mean@16 against compute for every run: {url}", flush=True)

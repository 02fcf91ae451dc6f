"""MLflow's UI as a user first sees it: a fresh headless Chromium (Debian's) opening the address
``make ui`` prints, over a store a real tiny campaign wrote and ``analysis fit`` fitted, and the
REST API its pages read; what that fit leaves (each run's report, the runs list's links) and a fit
that counts out an earlier version's run."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import matplotlib.image
import pandas as pd
import psutil
import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from runners.tracking import store as prl_store
from runners.tracking.server_processes import free_port
from tests.campaigns import wait_healthy


@pytest.fixture
def campaign_store(concurrent_campaign, monkeypatch):
    """The session's tiny campaign (tests/conftest.py), from its folder: the store it wrote (not
    conftest's ``store``, the worker's tracking server)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", concurrent_campaign["store"])
    monkeypatch.chdir(concurrent_campaign["root"])
    return concurrent_campaign["store"]


def fresh_browser(url: str, wait_for: list[str], shot: Path, tries: int = 3) -> str:
    """The DOM of ``url`` after a headless Chromium with a new, empty profile (no local storage: a
    first visit) ran its scripts, and its screenshot in ``shot``; rendered again (new profile) until
    every string of ``wait_for`` shows, at most ``tries`` times."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "the UI test needs Debian's headless Chromium: apt-get install chromium (make test does)"
    dom = ""
    for _ in range(tries):
        with tempfile.TemporaryDirectory() as profile:
            cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
            cmd += [f"--user-data-dir={profile}", "--window-size=1600,1000", "--virtual-time-budget=60000"]
            cmd += [f"--screenshot={shot}", "--dump-dom", url]
            dom = subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout
        if all(w in dom for w in wait_for):
            break
    Path(tempfile.gettempdir(), "prl-last-rendered.html").write_text(dom)  # for a failure's post-mortem
    return dom


@pytest.mark.slow
@pytest.mark.xdist_group("concurrent-campaign")  # one worker runs it, no other waits for it
def test_the_address_make_ui_prints_opens_on_the_campaigns_curves(campaign_store, concurrent_campaign, tmp_path, cli):
    """A first visit to the printed address lands on the campaign's runs (each one listed, not a
    collapsed parent), in the training workflow (not GenAI), with mean@16 of every run drawn against
    the campaign's compute axis; the fitted LOO table and plot are one click away."""
    path = concurrent_campaign["path"]
    assert not concurrent_campaign["failures"]
    fit = subprocess.run([sys.executable, "-m", "analysis", "fit", str(path)], capture_output=True, text=True)
    assert fit.returncode == 0, fit.stderr
    assert "curves in MLflow's UI: make ui, then open\nhttp://127.0.0.1:5000/#/experiments/" in fit.stdout
    client = MlflowClient(campaign_store)
    exp_id = client.get_experiment_by_name("concurrent").experiment_id
    parent = prl_store.parent_run(client, exp_id).info.run_id
    assert {"loo/loo_table.md", "loo/loo_curves.png", "loo/runs.md"} <= {
        a.path for a in client.list_artifacts(parent, "loo")
    }
    runs = client.search_runs([exp_id], "tags.`prl.run_id` != ''")
    for run in runs:  # the fit wrote each finished run's report and logged it to the run
        report = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
        assert {"report/report.md", "report/validation.png", "report/time_profile.png"} <= report
        assert run.data.tags["prl.report"] == "report/report.md"
    fit_dir = Path("artifacts", "campaigns", "concurrent", "fit").resolve()
    runs_md = (fit_dir / "runs.md").read_text()
    assert runs_md.count("](reports/") == 3 and "runs:/" not in runs_md  # links to the local reports
    assert all((fit_dir / link).is_file() for link in report_links(runs_md))

    port = free_port()
    cmd = [sys.executable, "-m", "runners", "ui", "--tracking-uri", campaign_store, "--port", str(port)]
    cmd += ["--campaign", str(path)]
    ui = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        # the start's progress and MLflow's own start-up lines come first; then the address, then the campaign's
        lines: list[str] = []
        while not lines or not lines[-1].startswith("MLflow UI: "):
            assert len(lines) < 50 and ui.poll() is None, lines
            lines.append(ui.stdout.readline())
        assert lines[0].startswith(f"starting the MLflow UI on http://127.0.0.1:{port}"), lines
        assert lines[-1].startswith(f"MLflow UI: http://127.0.0.1:{port}"), lines
        campaign = ui.stdout.readline()
        while not campaign.startswith("  campaign "):  # a server log line may come between
            assert len(lines) < 50 and ui.poll() is None, lines
            lines.append(campaign)
            campaign = ui.stdout.readline()
        assert campaign.startswith("  campaign concurrent, mean@16 against compute for every run: "), campaign
        url = campaign.split(": ", 1)[1].strip()
        wait_healthy(f"http://127.0.0.1:{port}")
        # the owner (runners ui), its mlflow ui and that one uvicorn worker: no job runner (8 more processes)
        assert len(psutil.Process(ui.pid).children(recursive=True)) == 2
        serves_the_campaign(f"http://127.0.0.1:{port}", exp_id)

        shot = tmp_path / "first-visit.png"
        legend = [f"{run}/seed0 (val/mean_at_16)" for run in ("baseline", "loss=dapo")]
        dom = fresh_browser(url, legend, shot)
        Path(tempfile.gettempdir(), "prl-ui-first-visit.png").write_bytes(shot.read_bytes())
        assert all(entry in dom for entry in legend)  # each run's mean@16 is drawn in the chart
        assert 'class="xtitle"' in dom and 'data-unformatted="compute/gpu_hours"' in dom  # the campaign's fit.x
        assert ">baseline/seed0<" in dom and ">loss=dapo/seed0<" in dom  # both runs listed, not folded away
        assert "No charts in this section" not in dom and "Detect Issues" not in dom
        image = matplotlib.image.imread(shot)
        assert image.shape[:2] == (1000, 1600) and image.std() > 0.05  # a page was drawn, not a blank one

        # the description above the runs links the fitted plot in the parent run's artifacts
        link = f"#/experiments/{exp_id}/runs/{parent}/artifacts/loo/loo_curves.png?workflowType=machine_learning"
        assert f'href="{link}"' in dom
        artifact = fresh_browser(f"http://127.0.0.1:{port}/{link}", ["loo/loo_curves.png"], tmp_path / "plot.png")
        assert "loo/loo_curves.png" in artifact and "loo_table.md" in artifact
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=30)
        ui.stdout.close()

    # a run an earlier version of this campaign left (another identity, same variant and seed): `analysis
    # fit` of the campaign file fits this version's runs and counts that one out; the reports the first
    # fit logged are copied beside this fit's runs.md, so its links open too. Deleted after: the other
    # tests of this session's campaign see the campaign as it ran.
    old = client.create_run(exp_id, tags={**runs[0].data.tags, "prl.run_id": "earlier-version"})
    try:
        client.log_batch(
            old.info.run_id, metrics=[Metric("val/mean_at_16", 0.9, 0, 0), Metric("compute/samples", 0, 0, 0)]
        )
        res = cli("analysis", "fit", str(path), "--out", str(tmp_path / "cli-fit"))
        assert res.returncode == 0, res.stderr
        assert "1 run(s) of another version of campaign concurrent" in res.stdout
        table = pd.read_csv(tmp_path / "cli-fit" / "loo_table.csv").set_index("variant")
        assert table.loc[runs[0].data.tags["prl.variant"], "points"] == 3  # steps 0, 2, 4 of this version's run
        links = report_links((tmp_path / "cli-fit" / "runs.md").read_text())
        assert len(links) == 3 and all((tmp_path / "cli-fit" / link).is_file() for link in links)
    finally:
        client.delete_run(old.info.run_id)


def serves_the_campaign(base: str, exp_id: str) -> None:
    """What the UI's pages read from its REST API: the experiment opens as training runs, and each
    run's mean@16 history is there to chart."""
    with urllib.request.urlopen(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=concurrent") as r:
        exp = json.load(r)["experiment"]
    assert exp["experiment_id"] == exp_id
    assert {"key": "mlflow.experimentKind", "value": "custom_model_development"} in exp["tags"]
    req = urllib.request.Request(
        f"{base}/api/2.0/mlflow/runs/search",
        method="POST",
        data=json.dumps({"experiment_ids": [exp_id], "filter": "tags.`prl.run_id` != ''"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req) as r:
        runs = json.load(r)["runs"]
    names = sorted(r["info"]["run_name"] for r in runs)
    assert names == ["baseline/seed0", "loss=dapo/seed0", "sampling=uniform/seed0"]
    for run in runs:
        query = f"run_id={run['info']['run_id']}&metric_key=val/mean_at_16"
        with urllib.request.urlopen(f"{base}/api/2.0/mlflow/metrics/get-history?{query}") as r:
            assert sorted(m["step"] for m in json.load(r)["metrics"]) == [0, 2, 4]


def report_links(runs_md: str) -> list[str]:
    """The relative report links of a runs.md."""
    return re.findall(r"\]\((reports/[^)]+/report\.md)\)", runs_md)


def test_a_campaigns_view_is_a_saved_view_of_its_runs_against_its_compute_axis():
    """The state the saved view holds: the campaign's runs (its parent filtered out, so none is
    folded under it), every one shown, and mean@16 against the fit's x in the first section."""
    from runners.campaign.ui import CHILD_RUNS, campaign_url, view_state

    state = view_state("compute/tokens", ["train/loss", "val/pass_at_16", "system/cpu_utilization_percentage"])
    assert state["searchFilter"] == CHILD_RUNS == "tags.`prl.variant` != ''" and state["runsHiddenMode"] == "SHOW_ALL"
    first, *others = state["compareRunSections"]
    assert first["display"] and not any(s["display"] for s in others)
    assert {"train", "val", "System metrics"} <= {s["name"] for s in others}
    (chart, _) = [c for c in state["compareRunCharts"] if c["metricSectionId"] == first["uuid"]]
    assert chart["metricKey"] == "val/mean_at_16" and chart["selectedXAxisMetricKey"] == "compute/tokens"
    json.dumps(state)
    url = campaign_url("http://127.0.0.1:5000/", "7")
    assert url.startswith("http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning&")

"""analysis/loo.ipynb executed as nbconvert executes it (nbclient), from a folder that is neither
the project nor the store's, over a real MLflow store holding a published campaign's curves: its
LOO table is `analysis fit`'s, number for number, and it writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from analysis.locate import PROJECT_ROOT, find_store
from runners.contract import COMPUTE_METRICS
from runners.tracking import store
from runners.tracking.store import StoreError
from tests.conftest import empty_store

PUBLISHED = PROJECT_ROOT / "results" / "loo-gpu" / "curves.csv"  # 20 runs, 13 evaluations each: fits to check
METRICS = ("val/mean_at_16", "val/pass_at_16", *COMPUTE_METRICS)


def store_from_curves(csv: Path, uri: str, name: str) -> None:
    """An MLflow store holding a published campaign's curves as its runs logged them: a parent run,
    a child per variant and seed with the campaign's tags and every metric's history. The runs are
    left unfinished (no `prl.done`): a finished run would get a report, and these hold no training
    metrics to write one from."""
    client = MlflowClient(uri)
    exp_id = store.experiment_id(client, name, create=True)
    parent = client.create_run(exp_id, run_name=name, tags={store.KIND: "campaign", store.CAMPAIGN: name})
    for (variant, seed), g in pd.read_csv(csv).groupby(["variant", "seed"]):
        tags = {
            "mlflow.parentRunId": parent.info.run_id,
            store.CAMPAIGN: name,
            store.VARIANT: variant,
            store.AXIS: "" if pd.isna(g["axis"].iloc[0]) else g["axis"].iloc[0],
            store.SEED: str(seed),
            store.RUN_ID: f"published-{variant}-{seed}",
        }
        run = client.create_run(exp_id, run_name=f"{variant}/seed{seed}", tags=tags)
        points = [Metric(k, float(r[k]), 0, int(r["step"])) for _, r in g.iterrows() for k in METRICS]
        client.log_batch(run.info.run_id, metrics=points)


RECORD_FIGURES = """
import json
import matplotlib.figure
FIGURES = []  # per figure saved: (label, points drawn) of each labelled line and collection of its axes
_savefig = matplotlib.figure.Figure.savefig
def _recording_savefig(fig, *args, **kwargs):
    FIGURES.append([
        (a.get_label(), len(a.get_xdata()) if hasattr(a, "get_xdata") else len(a.get_offsets()))
        for ax in fig.axes for a in (*ax.lines, *ax.collections) if not a.get_label().startswith("_")
    ])
    return _savefig(fig, *args, **kwargs)
matplotlib.figure.Figure.savefig = _recording_savefig
"""  # run before the notebook, in its kernel: the real savefig, what it saves recorded
SHOW_FIGURES = "print(json.dumps(FIGURES))"  # run after it


@pytest.fixture
def published(tmp_path, store_template):
    """A store of results/loo-gpu's curves in tmp/project/mlflow.db and a campaign file whose fit:
    section differs from the defaults (level, margin), so a notebook that ignores it shows it."""
    project = tmp_path / "project"
    project.mkdir()
    uri = empty_store(store_template, project / "mlflow.db")
    store_from_curves(PUBLISHED, uri, "nb-study")
    fit = {"x": "compute/samples", "eval_prompts": 1000, "a_grid": "0.05:1.0:0.005", "level": 0.8, "margin": 0.03}
    campaign = tmp_path / "nb-study.yaml"
    campaign.write_text(json.dumps({"name": "nb-study", "baseline": "scalerl", "seeds": [0], "fit": fit}))
    return project, uri, campaign


@pytest.mark.slow
def test_the_notebook_is_make_fit_number_for_number_from_any_folder(published, tmp_path, monkeypatch, cli):
    import nbformat
    from nbclient import NotebookClient

    project, uri, campaign = published
    out = tmp_path / "make-fit"
    # make fit, in this process; --partial: the published runs are stored unfinished (no report to write)
    res = cli("analysis", "fit", str(campaign), "--tracking-uri", uri, "--out", str(out), "--partial")
    assert res.returncode == 0, res.stderr

    source = PROJECT_ROOT / "analysis"
    before = sorted(p.name for p in source.iterdir())
    elsewhere = project / "notebooks" / "scratch"  # the kernel's folder: the store is two folders up
    elsewhere.mkdir(parents=True)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("PRL_CAMPAIGN", str(campaign))
    nb = nbformat.read(source / "loo.ipynb", as_version=4)
    nb.cells = [nbformat.v4.new_code_cell(RECORD_FIGURES), *nb.cells, nbformat.v4.new_code_cell(SHOW_FIGURES)]
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(elsewhere)}}).execute()
    figures = json.loads(nb.cells.pop()["outputs"][0]["text"])  # what each saved figure drew
    nb.cells.pop(0)

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"store sqlite:///{project / 'mlflow.db'}" in printed and "level=0.8" in printed
    markdown = [o["data"]["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {})]
    assert markdown == [(out / "loo_table.md").read_text()]  # the LOO table, number for number

    runs = next(o["data"]["text/plain"] for o in outputs if "completions" in o.get("data", {}).get("text/plain", ""))
    assert "device_hours" in runs and "tokens" in runs
    published_curves = pd.read_csv(PUBLISHED)
    variants = set(published_curves["variant"])
    assert any("image/png" in o.get("data", {}) for o in outputs)
    (figure,) = figures  # the notebook's one figure: every variant is drawn in it, with a fit or as points
    for v in variants:
        drawn = [(label, n) for label, n in figure if label.startswith(f"{v}: ")]
        assert drawn and all(n > 0 for _, n in drawn), (v, figure)
        points_only = dict(drawn).get(f"{v}: no fit")
        if points_only is not None:  # a variant without a fit: every one of its evaluations
            assert points_only == (published_curves["variant"] == v).sum(), (v, figure)

    expected = pd.read_csv(out / "extrapolation.csv")
    assert expected["predicted"].notna().sum() >= len(variants) - 1  # a real check: the variants are fitted
    check = next(o["data"]["text/plain"] for o in outputs if "fit_share" in o.get("data", {}).get("text/plain", ""))
    for value in expected["predicted"].dropna():
        assert f"{value:.6f}" in check

    assert list(elsewhere.iterdir()) == [] and sorted(p.name for p in source.iterdir()) == before  # wrote nothing


def test_the_store_is_found_from_any_folder_or_the_error_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    deep, empty_project = tmp_path / "a" / "b", tmp_path / "project"
    deep.mkdir(parents=True)
    empty_project.mkdir()
    with pytest.raises(StoreError, match="set MLFLOW_TRACKING_URI before starting Jupyter"):
        find_store(deep, root=empty_project)
    MlflowClient(f"sqlite:///{empty_project / 'mlflow.db'}").search_experiments()  # the project's store
    assert find_store(deep, root=empty_project) == f"sqlite:///{empty_project / 'mlflow.db'}"
    MlflowClient(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}").search_experiments()  # a nearer one, above the folder
    assert find_store(deep, root=empty_project) == f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/typo.db")
    with pytest.raises(StoreError, match="no MLflow store at"):
        find_store(deep, root=empty_project)

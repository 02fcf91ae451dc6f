"""`analysis fit` against a campaign that is not done, a store that holds a run twice, and a kill
mid-write: it says which runs are unfinished or missing and fits them only when asked
(``--partial``, into its own folder), counts runs trained twice, and leaves a fit folder whole or
as it was. Real MLflow stores, real processes."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from runners.campaign.load import expand, load_campaign
from runners.contract import MEAN_AT_16
from runners.tracking import store
from scalefit.data.synthetic import synthetic_curve
from tests.campaigns import write_campaign
from tests.conftest import empty_store

X = "compute/samples"
FIT = {"x": X, "a_grid": "0.05:1.0:0.005"}
AXES = {"loss": {"key": "algorithm.loss", "values": ["dapo", "gspo"]}}


def _log_run(client: MlflowClient, exp: str, spec, *, done: bool, start: int, points: int = 21) -> str:
    """A child run of the campaign as a campaign tags it, with a synthetic curve of ``points`` evaluations."""
    tags = {
        store.RUN_ID: spec.run_key,
        store.VARIANT: spec.variant,
        store.AXIS: spec.axis or "",
        store.SEED: str(spec.seed),
        store.CAMPAIGN: "unfinished",
    }
    run = client.create_run(exp, start_time=start, tags=tags, run_name=f"{spec.variant}/seed{spec.seed}").info.run_id
    c, v = synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0, n_points=21, seed=start)
    steps = range(0, 2 * points, 2)
    client.log_batch(
        run,
        metrics=[Metric(MEAN_AT_16, float(y), 0, s) for s, y in zip(steps, v[:points], strict=False)]
        + [Metric(X, float(x), 0, s) for s, x in zip(steps, c[:points], strict=False)],
    )
    if done:
        client.set_tag(run, store.DONE, "1")
        client.set_terminated(run)
    return run


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_campaign_still_running_is_named_and_fitted_only_when_asked_never_over_the_complete_fit(
    tmp_path, monkeypatch, store_template, cli
):
    """Issue 60, items 3 and 1: a campaign with a run still running, one never started and one trained
    twice (two copies of the campaign on one store). Before: exit 0, the campaign's fit folder
    overwritten with a table of what was there, logged to its parent run, and the second copy kept
    in silence. Now: refused naming each run, unless --partial, which fits into fit-partial/,
    logs nothing and leaves the complete fit alone; the copies are counted in a warning."""
    monkeypatch.chdir(tmp_path)
    uri = empty_store(store_template, tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    path = write_campaign(tmp_path / "unfinished.yaml", "unfinished", 40, AXES, seeds=[0, 1], fit=FIT)
    specs = {f"{s.variant}/seed{s.seed}": s for s in expand(load_campaign(path))}
    client = MlflowClient(uri)
    exp = client.create_experiment("unfinished")
    parent = client.create_run(exp, run_name="unfinished", tags={store.KIND: "campaign"}).info.run_id
    for i, name in enumerate(("baseline/seed0", "baseline/seed1", "loss=dapo/seed0", "loss=gspo/seed0")):
        _log_run(client, exp, specs[name], done=True, start=1000 + i)
    twice = _log_run(client, exp, specs["baseline/seed0"], done=True, start=2000)  # the second campaign's copy
    running = _log_run(client, exp, specs["loss=dapo/seed1"], done=False, start=3000, points=8)  # loss=gspo/seed1: none
    complete = tmp_path / "artifacts" / "campaigns" / "unfinished" / "fit"
    complete.mkdir(parents=True)
    (complete / "loo_table.md").write_text("the last complete fit\n")

    res = cli("analysis", "fit", str(path))
    assert res.returncode == 2, res.stderr
    warning, error = res.stderr.splitlines()
    assert warning.startswith("warning: 1 run(s) finished more than once in this store (two campaigns trained them")
    assert "baseline/seed0 (2 finished runs: " in warning and twice in warning
    assert error == (
        "error: campaign unfinished has not finished: 1 of 6 runs unfinished (loss=dapo/seed1 running), 1 never"
        " started (loss=gspo/seed1); fit it once they end (`python -m runners campaign unfinished` runs and resumes"
        " them), or pass --partial to fit what there is into artifacts/campaigns/unfinished/fit-partial (the"
        " complete fit stays)"
    )
    assert _files(complete.parent) == {"fit/loo_table.md": b"the last complete fit\n"}

    res = cli("analysis", "fit", str(path), "--partial")
    assert res.returncode == 0, res.stderr
    assert (
        "warning: a partial fit of campaign unfinished: 1 of 6 runs unfinished (loss=dapo/seed1 running), 1 never"
        " started (loss=gspo/seed1); fitted on the curves so far into artifacts/campaigns/unfinished/fit-partial"
        in res.stderr
    )
    assert _files(complete) == {"loo_table.md": b"the last complete fit\n"}
    partial = complete.with_name("fit-partial")
    table = pd.read_csv(partial / "loo_table.csv").set_index("variant")
    assert table.loc["loss=dapo", "unfinished"] == 1 and set(table.index) == {"baseline", "loss=dapo", "loss=gspo"}
    assert client.list_artifacts(parent) == []  # no campaign's result logged from a partial fit
    assert store.READING not in client.get_run(running).data.tags

    client.set_tag(running, store.DONE, "1")  # the campaign ends
    _log_run(client, exp, specs["loss=gspo/seed1"], done=True, start=4000)
    res = cli("analysis", "fit", str(path))
    assert res.returncode == 0, res.stderr
    assert (
        "loo_table.csv" in os.listdir(complete)
        and "the last complete fit" not in (complete / "loo_table.md").read_text()
    )
    assert [a.path for a in client.list_artifacts(parent)] == ["loo"]
    assert not [p for p in complete.parent.iterdir() if p.name.startswith(".fit")]  # no folder left beside it


def test_fit_and_report_on_a_damaged_store_are_one_line_and_write_nothing(tmp_path, monkeypatch, store_template, cli):
    """Issue 60, item 5: a finished campaign's store with a damaged page MLflow's queries do not reach
    (the model registry's table): `analysis fit` and `analysis report` returned 0 and wrote into it
    (tags, artifacts). Now each ends on `campaign`'s line for a corrupt store, and neither the store nor
    the project folder is touched."""
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "mlflow.db"
    uri = empty_store(store_template, db)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    path = write_campaign(tmp_path / "c.yaml", "unfinished", 40, AXES, fit=FIT)
    client = MlflowClient(uri)
    exp = client.create_experiment("unfinished")
    client.create_run(exp, run_name="unfinished", tags={store.KIND: "campaign"})
    for i, spec in enumerate(expand(load_campaign(path))):
        _log_run(client, exp, spec, done=True, start=1000 + i)
    with sqlite3.connect(db) as con:
        (page,) = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'registered_models'").fetchone()
    with db.open("r+b") as fh:  # SQLite numbers pages from 1
        fh.seek((page - 1) * 4096)
        fh.write(b"\xff" * 4096)
    before = db.read_bytes()
    line = (
        f"error: the MLflow store {db} is corrupt (SQLite: Page {page}: btreeInitPage() returns error code 11);"
        f" restore it from a backup, or move it aside to start a new store (mv {db} {db}.corrupt)"
    )
    for args in (["fit", str(path)], ["report", "baseline/seed0", "--experiment", "unfinished"]):
        res = cli("analysis", *args)
        assert (res.returncode, res.stderr.strip()) == (2, line), args
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "mlflow.db"]  # no artifacts/, no mlruns/


KILLED = """
import resource, signal, sys
import analysis.loo, analysis.summary, matplotlib.pyplot  # imported before the limit
from analysis.cli import main
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it: a file over the limit now kills the process
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
main(sys.argv[2:])
"""


def _curves_csv(path: Path, shift: float = 0.0) -> Path:
    rows = []
    for i, variant in enumerate(("baseline", "loss=dapo")):
        for seed in (0, 1):
            c, v = synthetic_curve(2542, 1.92, 0.61 - shift * i, c_max=16_000.0, n_points=21, seed=10 * i + seed)
            rows.append(
                pd.DataFrame(
                    {
                        "run": f"{variant}/seed{seed}",
                        "variant": variant,
                        "axis": "" if variant == "baseline" else "loss",
                        "seed": seed,
                        "step": range(len(c)),
                        X: c,
                        MEAN_AT_16: v,
                    }
                )
            )
    pd.concat(rows).to_csv(path, index=False)
    return path


@pytest.mark.slow
def test_a_fit_killed_mid_write_leaves_the_previous_fit_whole(tmp_path, cli):
    """Issue 60, item 4: a fit killed while writing its plot (here by the kernel: a file-size limit the
    plot passes, SIGXFSZ) left the new loo_table.csv/md beside the previous fit's loo_curves.png and
    extrapolation.csv, unmarked. Now the folder holds the previous fit, file for file; the next fit
    replaces it whole and clears what the killed one left."""
    path = write_campaign(tmp_path / "killed.yaml", "killed", 40, AXES, fit=FIT)
    out = tmp_path / "fit"
    first = cli("analysis", "fit", str(path), "--curves", str(_curves_csv(tmp_path / "a.csv")), "--out", str(out))
    assert first.returncode == 0, first.stderr
    before = _files(out)
    assert set(before) == {"loo_table.csv", "loo_table.md", "loo_curves.png", "extrapolation.csv"}
    limit = max(len(before["loo_table.csv"]), len(before["loo_table.md"])) + 4096  # the tables pass, the plot not
    assert len(before["loo_curves.png"]) > limit
    again = _curves_csv(tmp_path / "b.csv", shift=0.1)  # another fit: every file differs
    args = ["fit", str(path), "--curves", str(again), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PYTHONDONTWRITEBYTECODE": "1"}
    killed = subprocess.run([sys.executable, "-c", KILLED, str(limit), *args], env=env, capture_output=True, text=True)
    assert killed.returncode == -25, killed.stderr[-2000:]  # SIGXFSZ: killed mid-write
    assert _files(out) == before
    res = cli("analysis", *args)
    assert res.returncode == 0, res.stderr
    after = _files(out)
    assert set(after) == set(before) and all(after[k] != before[k] for k in after)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "b.csv", "fit", "killed.yaml"]


def test_scalefits_json_killed_mid_write_leaves_the_previous_file(tmp_path):
    """Issue 60, item 4: ``write_json`` killed mid-write (SIGXFSZ at a file-size limit) truncated the
    earlier file to half a JSON document; now it is left whole."""
    dest = tmp_path / "sizes.json"
    dest.write_text(json.dumps({"earlier": True}) + "\n")
    code = (
        "import resource, signal, sys\n"
        "from scalefit.data.outputs import write_json\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_DFL)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        f"write_json({{'values': list(range(5000))}}, {str(dest)!r})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PYTHONDONTWRITEBYTECODE": "1"}
    killed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert killed.returncode == -25, killed.stderr[-2000:]
    assert json.loads(dest.read_text()) == {"earlier": True}


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_what_a_killed_fit_leaves_is_put_right_and_a_shared_folder_keeps_its_other_files(tmp_path):
    """The states a kill leaves beside a fit folder, planted with a dead process's pid: between the two
    renames (the old fit set aside, the new one whole beside it: moved in), and mid-write (deleted).
    A folder the fit shares (results/NAME) keeps its own files and the curves it fits; the new fit's
    files replace the old ones, and an old file this fit does not write is not left to pass for its."""
    from analysis.outputs import INCOMPLETE, tidy, written_whole

    out, pid = tmp_path / "fit", _dead_pid()
    (tmp_path / f".fit.old-{pid}").mkdir()
    (tmp_path / f".fit.old-{pid}" / "loo_table.md").write_text("old\n")
    (tmp_path / f".fit.new-{pid}").mkdir()
    (tmp_path / f".fit.new-{pid}" / "loo_table.md").write_text("new\n")
    tidy(out)
    assert _files(out) == {"loo_table.md": b"new\n"} and os.listdir(tmp_path) == ["fit"]
    (tmp_path / f".fit.new-{pid}").mkdir()  # cut short mid-write
    (tmp_path / f".fit.new-{pid}" / "loo_table.md").write_text("half")
    tidy(out)
    assert _files(out) == {"loo_table.md": b"new\n"} and os.listdir(tmp_path) == ["fit"]

    shared = tmp_path / "results"
    shared.mkdir()
    for name, text in (("RESULTS.md", "notes"), ("curves.csv", "input"), ("loo_table.md", "old"), ("sizes.md", "old")):
        (shared / name).write_text(text)
    with written_whole(shared) as stage:
        (stage / "loo_table.md").write_text("new")
    assert _files(shared) == {"RESULTS.md": b"notes", "curves.csv": b"input", "loo_table.md": b"new"}
    assert INCOMPLETE not in os.listdir(shared) and sorted(os.listdir(tmp_path)) == ["fit", "results"]

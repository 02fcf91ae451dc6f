"""Stores, locks and permissions (#42 items 2, 3 and 12): one SQLite file is one store whatever path
reaches it, a campaign on a store that does not hold its runs says so instead of filling it with
partial runs, a store is created only where asked for, and stores and run folders are private to
their owner. Real processes, the tiny model, real SQLite MLflow stores."""

from __future__ import annotations

import grp
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.campaigns import write_campaign
from tests.conftest import empty_store


def one_line(res: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line a refused command ends with (exit 2, no traceback)."""
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr[-3000:]
    return lines[0]


# --- item 2: the campaign lock is the store file's, whatever path reaches it -------------------


HOLD = """
import sys, time
from pathlib import Path
from runners.campaign.runs import campaign_lock
from runners.locks import hold
with hold(campaign_lock("same", sys.argv[1]), "campaign same", "wait"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_second_campaign_on_the_same_store_through_another_path_is_refused(tmp_path, store_template):
    """A campaign holds its store while another, given the same mlflow.db through a symlink (to the
    file, or to its folder) or a ``..`` path, is refused naming the holder: before, the lock was
    keyed by the path as written, and both ran on one store (a UNIQUE-constraint traceback, or a
    duplicate child run left RUNNING)."""
    from runners.campaign.runs import run_campaign
    from runners.locks import Busy

    real = tmp_path / "store" / "mlflow.db"
    real.parent.mkdir()
    empty_store(store_template, real)
    (tmp_path / "elsewhere" / "deeper").mkdir(parents=True)
    (tmp_path / "elsewhere" / "mlflow.db").symlink_to(real)
    (tmp_path / "elsewhere" / "link").symlink_to(real.parent)
    (tmp_path / "store" / "sub").symlink_to(tmp_path / "elsewhere" / "deeper")
    reaches = {
        "a symlink to the file": tmp_path / "elsewhere" / "mlflow.db",
        "a symlink to its folder": tmp_path / "elsewhere" / "link" / "mlflow.db",
        "a .. path through a symlink": Path(f"{tmp_path}/store/sub/../../store/mlflow.db"),
    }
    path = write_campaign(tmp_path / "same.yaml", "same", 2, {})
    runs_root = tmp_path / "campaigns"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, f"sqlite:///{real}", str(runs_root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        for how, other in reaches.items():
            assert other.resolve() == real and other.exists(), how

            def started(line: str, how: str = how) -> None:
                raise AssertionError(f"a second campaign started through {how} on a store another holds: {line}")

            with pytest.raises(Busy) as refused:
                run_campaign(path, tracking_uri=f"sqlite:///{other}", runs_root=runs_root, log=started)
            line = str(refused.value)
            assert f"campaign same on store sqlite:///{real} is in use by pid {holder.pid} (" in line, (how, line)
    finally:
        holder.kill()
        holder.wait()
    assert MlflowClient(f"sqlite:///{real}").get_experiment_by_name("same") is None  # nothing written


# --- a finished campaign in a fresh project, as `make ablation` leaves it ------------------------


def modes(root: Path) -> dict[str, int]:
    """The permission bits of every file and folder under ``root``, by path relative to it."""
    return {str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode) for p in [root, *root.rglob("*")]}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_base) -> dict:
    """A tiny campaign (one run, 2 steps) run to the end by ``python -m runners campaign`` in a fresh
    project folder with no store yet and no MLFLOW_TRACKING_URI: it creates the project's default
    store, ``mlflow.db``. The modes of what it wrote are taken at once (``modes``), before another
    test adds to the folder."""
    project = tmp_path_factory.mktemp("project")
    path = write_campaign(project / "first.yaml", "first", 2, {})
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    res = subprocess.run(
        [sys.executable, "-m", "runners", "campaign", str(path)], cwd=project, env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (folder,) = (project / "artifacts" / "campaigns" / "first").glob("baseline-*")
    return {"project": project, "path": path, "store": project / "mlflow.db", "folder": folder, "modes": modes(project)}


def _run(client: MlflowClient, name: str):
    (run,) = client.search_runs([client.get_experiment_by_name(name).experiment_id], "tags.`prl.run_id` != ''")
    return run


# --- item 3: a store is where the user meant it ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.xdist_group("stores")
def test_a_campaign_pointed_at_another_store_says_so_and_creates_none_unasked(
    finished, tmp_path, monkeypatch, store_template, cli
):
    """The issue's probe: a finished campaign re-run with MLFLOW_TRACKING_URI at a mistyped path, or at
    a store that does not hold its runs. Before: the store was created, and the run folders said
    done, so each run was re-tracked "done" with 13 of 56 metric keys. Now: a missing store is
    refused naming the path and --new-store (``--dry-run`` creates none); a store without the
    campaign's runs is refused naming the store the run folder records (or saying that this store,
    the one recorded, no longer has them); ``make import`` of that
    store makes it whole; ``--new-store`` creates the store and trains the runs again into it, their
    old files set aside."""
    project, path, folder = finished["project"], str(finished["path"]), finished["folder"]
    first = f"sqlite:///{finished['store']}"
    assert json.loads((folder / "store.json").read_text())["store"] == first  # the folder remembers its store
    monkeypatch.chdir(project)

    typo = tmp_path / "some" / "new" / "dir" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{typo}")
    assert one_line(cli("runners", "campaign", path)) == (
        f"error: no MLflow store at {typo}, and its folder {typo.parent} does not exist: check the path "
        "(MLFLOW_TRACKING_URI), or pass --new-store to create a new store there"
    )
    listed = cli("runners", "campaign", path, "--dry-run")
    assert listed.returncode == 0 and f"no MLflow store at {typo} yet (--dry-run creates none)" in listed.stdout
    assert not (tmp_path / "some").exists()  # neither made a store, nor its folder

    other = tmp_path / "other.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store(store_template, other))
    line = one_line(cli("runners", "campaign", path))
    assert line.startswith(f"error: campaign first: the run folder {folder} hold(s) runs tracked in the store {first}")
    assert f"make import SRC={finished['store']}" in line and "--new-store" in line, line
    assert MlflowClient(f"sqlite:///{other}").get_experiment_by_name("first") is None
    assert (folder / "done.json").is_file()
    alone = one_line(cli("runners", "train", str(folder / "recipe.yaml"), "--run-dir", str(folder)))  # a single run
    assert alone.startswith(f"error: {folder} holds a run tracked in the store {first}, not in sqlite:///{other}: ")
    assert "--new-store" in alone and (folder / "done.json").is_file()

    kept = finished["store"].rename(tmp_path / "kept.db")  # the store the folder records, replaced by an empty one
    try:  # in a process of its own: MLflow keeps a store's connections open in the process that used it
        empty_store(store_template, finished["store"])
        env = os.environ | {"MLFLOW_TRACKING_URI": first}
        cmd = [sys.executable, "-m", "runners", "campaign", path]
        line = one_line(subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=project))
        assert f"hold(s) runs tracked in this store, {first}, which no longer has them (replaced or emptied?)" in line
    finally:
        kept.replace(finished["store"])
    assert cli("runners", "import", str(finished["store"]), "--tracking-uri", f"sqlite:///{other}").returncode == 0
    again = cli("runners", "campaign", path)
    assert again.returncode == 0 and "1 done, 0 stopped, 0 to run" in again.stdout, again.stdout + again.stderr

    new = tmp_path / "new.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{new}")
    retrained = cli("runners", "campaign", path, "--new-store")
    assert retrained.returncode == 0, retrained.stdout[-3000:] + retrained.stderr[-3000:]
    assert f"created the MLflow store {new} (mode 600)" in retrained.stdout
    (aside,) = folder.glob("other-store-*")
    assert (aside / "done.json").is_file() and json.loads((aside / "store.json").read_text())["store"] == first
    theirs, mine = _run(MlflowClient(first), "first"), _run(MlflowClient(f"sqlite:///{new}"), "first")
    assert mine.data.tags["prl.done"] == "1" and sorted(mine.data.metrics) == sorted(theirs.data.metrics)
    assert json.loads((folder / "store.json").read_text()) == {"store": f"sqlite:///{new}", "run_id": mine.info.run_id}


def test_a_single_run_makes_no_store_unasked(tmp_path, monkeypatch, cli):
    """``runners train`` tracked to a mistyped store is refused before a model loads (here one that
    does not exist: before, the store was made, then the model was found missing), the store and
    its folder left uncreated, and its run folder too (issue 60, item 11: before, the folder was made,
    with its ``identity.json`` and ``train.lock``, and only then was the store refused)."""
    typo = tmp_path / "typo" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{typo}")
    monkeypatch.chdir(tmp_path)
    model = ["--set", "model.size=null", "--set", f"model.path={tmp_path / 'no-model'}"]
    assert one_line(cli("runners", "train", "scalerl", *model, "--run-dir", str(tmp_path / "run"))) == (
        f"error: no MLflow store at {typo}, and its folder {typo.parent} does not exist: check the path "
        "(MLFLOW_TRACKING_URI), or pass --new-store to create a new store there"
    )
    assert not typo.parent.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no run folder, no artifacts/, no mlruns/


def _source_store(store_template, db: Path) -> str:
    """A store with one experiment and one finished run, to import from."""
    uri = empty_store(store_template, db)
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("elsewhere"), run_name="baseline/seed0")
    client.log_metric(run.info.run_id, "val/mean_at_16", 0.5, step=0)
    client.set_terminated(run.info.run_id)
    return uri


def test_import_and_ui_make_no_store_unasked(tmp_path, monkeypatch, store_template, cli):
    """Issue 60, item 2: ``runners import`` and ``runners ui`` given a mistyped store created it (its
    folder, and the imported artifacts in ./mlruns), exited 0, and from then on a ``campaign`` with
    the same typo found a store and was no longer refused. Now both are refused as ``campaign`` is,
    nothing made; ``--new-store`` creates the store (private) where asked."""
    from runners.tracking.server_processes import free_port

    source = _source_store(store_template, tmp_path / "source.db")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    typo = tmp_path / "some" / "new" / "dir" / "mlflow.db"
    refusal = (
        f"error: no MLflow store at {typo}, and its folder {typo.parent} does not exist: check the path "
        "(MLFLOW_TRACKING_URI), or pass --new-store to create a new store there"
    )
    assert one_line(cli("runners", "import", source, "--tracking-uri", f"sqlite:///{typo}")) == refusal
    cmd = [sys.executable, "-m", "runners", "ui", "--tracking-uri", f"sqlite:///{typo}", "--port", str(free_port())]
    ui = subprocess.Popen(
        cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = ui.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.communicate()
        pytest.fail(f"runners ui served a store it made at a mistyped path ({typo.exists() = })")
    assert one_line(subprocess.CompletedProcess(cmd, ui.returncode, out, err)) == refusal
    assert not (tmp_path / "some").exists() and list(work.iterdir()) == []  # no store, folder or mlruns/

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{typo}")
    camp = write_campaign(tmp_path / "c.yaml", "c", 2, {})
    assert one_line(cli("runners", "campaign", str(camp))) == refusal  # still refused: no store was made

    made = cli("runners", "import", source, "--new-store")
    assert made.returncode == 0 and f"1 run(s), 1 metric points → sqlite:///{typo}" in made.stdout, made.stderr
    assert stat.S_IMODE(typo.stat().st_mode) == 0o600 and stat.S_IMODE(typo.parent.stat().st_mode) == 0o700
    client = MlflowClient(f"sqlite:///{typo}")
    (run,) = client.search_runs([client.get_experiment_by_name("elsewhere").experiment_id])
    assert run.data.metrics == {"val/mean_at_16": 0.5}


def test_analysis_fit_on_a_missing_store_makes_no_fit_folder(tmp_path, monkeypatch, cli):
    """Issue 60, item 11: ``analysis fit`` on a store that does not exist made an empty
    ``artifacts/campaigns/NAME/fit`` before the store was found missing. Now the store is checked first."""
    monkeypatch.chdir(tmp_path)
    typo = tmp_path / "typo.db"
    line = one_line(cli("analysis", "fit", "loo-cpu", "--tracking-uri", f"sqlite:///{typo}"))
    assert line.startswith(f"error: no MLflow store at {typo} (no such file): "), line
    assert list(tmp_path.iterdir()) == []  # no artifacts/, no store


# --- item 12: stores and run folders are private ----------------------------------------------


@pytest.mark.slow
@pytest.mark.xdist_group("stores")
def test_a_campaign_writes_its_store_and_run_folders_private(finished):
    """Before: mlflow.db was created 0644 and run folders 0755, so any local account could read every
    run's parameters, metrics and checkpoints. Now the store (and SQLite's journal files) is 0600 and
    every folder and file the campaign wrote is its owner's alone: no group or other bits."""
    written = finished["modes"]
    assert written["mlflow.db"] == 0o600
    run = str(finished["folder"].relative_to(finished["project"]))
    assert written[run] == 0o700 and written["artifacts/campaigns/first"] == 0o700
    shared = {p: oct(m) for p, m in written.items() if m & 0o077 and p not in (".", "first.yaml")}
    assert not shared, shared  # what the campaign wrote (run files, checkpoints, MLflow's artifacts, locks)


def test_prl_group_shares_stores_and_folders_with_a_group(tmp_path, monkeypatch, cli):
    """``PRL_GROUP`` names the group a new store (0660) and its new folders (2770, setgid: what is
    made inside keeps the group) are given to; a group that does not exist is one line."""
    from runners.tracking.store import create_store

    name = grp.getgrgid(os.getegid()).gr_name
    monkeypatch.setenv("PRL_GROUP", name)
    db = tmp_path / "team" / "mlflow.db"
    assert create_store(f"sqlite:///{db}") and not create_store(f"sqlite:///{db}")
    assert stat.S_IMODE(db.stat().st_mode) == 0o660 and db.stat().st_gid == os.getegid()
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o2770 and db.parent.stat().st_gid == os.getegid()

    monkeypatch.setenv("PRL_GROUP", "no-such-group-prl")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    assert one_line(cli("runners", "campaign", "loo-cpu", "--dry-run")) == (
        "error: PRL_GROUP=no-such-group-prl: no such group; name a group you belong to (id -Gn lists them), "
        "or unset PRL_GROUP to keep stores and run folders private to you"
    )


def test_analysis_fit_and_report_write_private_outputs(tmp_path, monkeypatch, store_template, cli):
    """Issue 60, item 12: ``analysis fit`` and ``analysis report`` wrote 0755 folders and 0644 files,
    so an ``artifacts/`` they made first stayed readable by every local account. Now they run with
    a campaign's umask (``runners.permissions``): under a umask of 0022, every folder and file each makes
    (the fit's tables and plot, the report and its plots, the artifacts MLflow copies) has no group
    or other bits."""
    from mlflow.entities import Metric

    from runners.contract import MEAN_AT_16
    from tests.test_analysis import curves

    fit, report = tmp_path / "fit", tmp_path / "report"  # a fresh project folder each: artifacts/ made by them
    fit.mkdir()
    report.mkdir()
    df = curves({"baseline": (2542, 1.92, 0.61), "loss=dapo": (2542, 1.92, 0.55)})
    df.insert(0, "run", df["variant"] + "/seed" + df["seed"].astype(str))
    df.rename(columns={"compute/gpu_hours": "compute/samples"}).to_csv(tmp_path / "curves.csv", index=False)

    monkeypatch.chdir(report)  # the experiment's artifact folder (./mlruns) is where the report is made
    uri = empty_store(store_template, tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    rid = client.create_run(client.create_experiment("c"), run_name="baseline/seed0").info.run_id
    points = [(s, 0.4 + s / 200) for s in range(0, 41, 10)]
    metrics = [Metric(MEAN_AT_16, v, 0, s) for s, v in points] + [
        Metric("compute/samples", 128.0 * s, 0, s) for s, _ in points
    ]
    client.log_batch(rid, metrics=metrics)
    client.set_terminated(rid)
    old = os.umask(0o022)  # a login shell's: what the commands wrote before is readable by all
    try:
        made = cli("analysis", "report", rid, "--tracking-uri", uri)
        assert made.returncode == 0, made.stderr
        monkeypatch.chdir(fit)
        made = cli("analysis", "fit", "loo-cpu", "--curves", str(tmp_path / "curves.csv"))
        assert made.returncode == 0, made.stderr
    finally:
        os.umask(old)
    for root, first in ((fit, "artifacts/campaigns/loo-cpu/fit/loo_table.csv"), (report, "artifacts/reports")):
        written = modes(root)
        assert first in written and written["artifacts"] == 0o700, sorted(written)
        shared = {p: oct(m) for p, m in written.items() if m & 0o077 and p != "."}
        assert not shared, shared
    assert any(p.startswith("mlruns/") and p.endswith("report.md") for p in modes(report))  # logged to the run

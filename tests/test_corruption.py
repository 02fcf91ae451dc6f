"""Corrupt checkpoints, read-only folders and a corrupt store (#42 items 5-7): a checkpoint changed
after its save is skipped for the one before by its recorded sha256; a read-only artifacts folder or
base-model cache, and an MLflow store that is no SQLite database, each end a command in one line
naming the file and the fix, before compute is spent or an MLflow run is created."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from tests.campaigns import TINY as CAMPAIGN_TINY
from tests.campaigns import write_campaign
from tests.conftest import empty_store, remount, tmpfs

TINY = {**CAMPAIGN_TINY, "train.steps": 4, "train.save_every": 2, "eval.every": 2}  # the tiny run, 4 steps
SETS = [f"--set={k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in TINY.items()]


def test_a_checkpoint_corrupted_after_its_save_is_skipped_for_the_one_before(tiny_base, tmp_path):
    """4 KiB overwritten inside checkpoint-4's optimizer.pt keep its size and its zip directory, so
    the file looks whole; its sha256, recorded at the save, tells. The re-run says which file
    changed and resumes from checkpoint-2 (before, it resumed from the corrupt state). A checkpoint
    saved before checksums were recorded still resumes."""
    from runners.recipe import load_recipe
    from runners.rl.train import STATE_FILE, last_complete_checkpoint, metric_records, train

    recipe, run = load_recipe("scalerl", TINY), tmp_path / "run"
    train(recipe, run, log=lambda m: None)
    optimizer = run / "checkpoints" / "checkpoint-4" / "optimizer.pt"
    size = optimizer.stat().st_size
    with optimizer.open("r+b") as fh:
        fh.seek(size // 2)
        fh.write(b"\xff" * 4096)  # NaN bytes in the optimizer's moments
    assert optimizer.stat().st_size == size
    (run / "done.json").unlink()  # killed before the run could finish
    said: list[str] = []
    train(recipe, run, log=said.append)
    assert (
        f"[{recipe.name}] skipping checkpoint-4: optimizer.pt corrupted (its sha256 differs from the one "
        "recorded at its save)" in said
    ), said
    assert any(m.endswith(f"resuming from {run / 'checkpoints' / 'checkpoint-2'}") for m in said), said
    assert [r["step"] for r in metric_records(run / "metrics.jsonl")] == [0, 2, 4]
    assert last_complete_checkpoint(run / "checkpoints") == (run / "checkpoints" / "checkpoint-4", [])  # saved anew

    state = run / "checkpoints" / "checkpoint-4" / STATE_FILE
    legacy = json.loads(state.read_text())
    del legacy["sha256"]  # as a checkpoint saved before this change
    state.write_text(json.dumps(legacy))
    with optimizer.open("r+b") as fh:  # a change no checksum can tell
        fh.seek(size // 2)
        fh.write(b"\xff" * 4096)
    assert last_complete_checkpoint(run / "checkpoints") == (run / "checkpoints" / "checkpoint-4", [])


def _corrupt_store(path, template, damage: str) -> str:
    """A store at ``path`` that is no SQLite database (``garbage``) or whose middle page holds 4 KiB
    of 0xff (``page``); the words SQLite says it with."""
    if damage == "garbage":
        path.write_bytes(bytes(range(256)) * 800)
        return "file is not a database"
    shutil.copyfile(template, path)
    with path.open("r+b") as fh:
        fh.seek(path.stat().st_size // 2 // 4096 * 4096)
        fh.write(b"\xff" * 4096)
    return r"Page \d+: .+"


@pytest.mark.parametrize("damage", ["garbage", "page"])
def test_a_corrupt_store_is_one_line_naming_it_from_each_command(tmp_path, monkeypatch, store_template, cli, damage):
    """campaign (and --dry-run), train, ui, and analysis fit and report on a corrupt mlflow.db: one line
    naming the file and what to do, before a lock, a server, a run folder, a fit folder or an MLflow
    run; the file is left as it was (before: an 83-line SQLAlchemy traceback, 67 lines from the UI's
    server; `analysis fit` made artifacts/campaigns/NAME/fit first, issue 60 items 5 and 11)."""
    from runners.tracking.server_processes import free_port

    db = tmp_path / "mlflow.db"
    said = _corrupt_store(db, store_template, damage)
    before = db.read_bytes()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.chdir(tmp_path)
    camp = str(write_campaign(tmp_path / "c.yaml", "corrupt", 2, {}))
    line = (
        re.escape(f"error: the MLflow store {db} is corrupt (SQLite: ")
        + said
        + re.escape(f"); restore it from a backup, or move it aside to start a new store (mv {db} {db}.corrupt)")
    )
    commands = [["campaign", camp, "--dry-run"], ["campaign", camp], ["train", "scalerl", *SETS]]
    commands = [("runners", *args) for args in [*commands, ["ui", "--port", str(free_port())]]]
    for args in [*commands, ("analysis", "fit", camp), ("analysis", "report", "latest")]:
        res = cli(*args)
        assert res.returncode == 2 and re.fullmatch(line, res.stderr.strip()), (args, res.stderr[-2000:])
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "mlflow.db"]  # no mlruns/, artifacts/, lock
    shell = subprocess.run(
        [sys.executable, "-m", "runners", "campaign", camp, "--dry-run"], capture_output=True, text=True, timeout=300
    )
    assert shell.returncode == 2 and re.fullmatch(line, shell.stderr.strip()), shell.stderr[-2000:]


def _runs_in(db) -> list:
    client = MlflowClient(f"sqlite:///{db}")
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def test_a_read_only_artifacts_folder_is_one_line_before_a_lock_or_a_run(tmp_path, monkeypatch, store_template, cli):
    """A campaign run from a folder whose artifacts/ is a read-only mount: one line naming the
    folder, and nothing made (before: a 52-line traceback, a parent run left RUNNING, ./mlruns)."""
    db = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store(store_template, db))
    monkeypatch.chdir(tmp_path)
    camp = str(write_campaign(tmp_path / "c.yaml", "ro-artifacts", 2, {}))
    with tmpfs(tmp_path / "artifacts", 1024) as ro:
        remount(ro, "ro")
        res = cli("runners", "campaign", camp)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stderr.strip() == (
        f"error: cannot write the campaign's folder {ro / 'campaigns' / 'ro-artifacts'} ({ro}: Read-only file "
        "system); make it writable (its runs' folders and MLflow artifacts go there), or run the campaign from "
        "another folder"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifacts", "c.yaml", "mlflow.db"]  # no lock, no mlruns/
    assert _runs_in(db) == []


def test_a_read_only_base_model_cache_is_one_line_before_the_build(tmp_path, monkeypatch, store_template, cli):
    """A base model to build into a read-only cache (PRL_CACHE): one line naming the cache from
    train, base-model and campaign, before a run or the build's compute (before: 44 lines after it)."""
    db = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store(store_template, db))
    monkeypatch.chdir(tmp_path)
    camp = str(write_campaign(tmp_path / "c.yaml", "ro-cache", 2, {}))
    commands = [["train", "scalerl", *SETS], ["base-model", "scalerl", "--set", "model.size=tiny"], ["campaign", camp]]
    with tmpfs(tmp_path / "cache", 1024) as ro:
        remount(ro, "ro")
        monkeypatch.setenv("PRL_CACHE", str(ro))
        for args in commands:
            res = cli("runners", *args)
            assert res.returncode == 2, (args, res.stdout[-2000:] + res.stderr[-2000:])
            assert res.stderr.strip() == (
                f"error: cannot build the base model 'tiny' into its cache {ro / 'base-models'} ({ro}: Read-only "
                "file system); make it writable, or set PRL_CACHE to a writable folder (the cache is "
                "PRL_CACHE/base-models)"
            ), args
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "cache", "mlflow.db"]  # no run folder, no lock
    assert _runs_in(db) == []

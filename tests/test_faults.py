"""Faults that end in one clear line and no traceback: a disk that fills up mid-checkpoint (a real
tmpfs under a real tiny run, which then resumes), a read-only run folder, a history with nothing to
resume from, a path given as a tracking URI, and a device count below one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from tests.campaigns import TINY as CAMPAIGN_TINY
from tests.conftest import remount, tmpfs

TINY = {**CAMPAIGN_TINY, "train.steps": 4, "train.save_every": 2, "eval.every": 2}  # the tiny run, 4 steps
SETS = [f"--set={k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in TINY.items()]


@pytest.mark.slow
def test_a_full_disk_mid_checkpoint_is_one_line_naming_the_folder_and_the_rerun_resumes(tiny_base, tmp_path):
    """The disk holds the run up to checkpoint-2 and fills up while checkpoint-4's optimizer state
    (about twice the weights) is written: torch's zip writer raises 'unexpected pos', which the
    command turns into one line; after space is freed, the re-run skips the half-written
    checkpoint-4 and resumes from checkpoint-2, each evaluation recorded once."""
    from runners.recipe import load_recipe
    from runners.rl.train import metric_records, train

    weights = (tiny_base / "model.safetensors").stat().st_size
    # at checkpoint-4 the disk holds best/ (weights) and checkpoint-2 (weights + optimizer = 3x),
    # then checkpoint-4's weights: 6x the weights fills up inside its optimizer file (2x)
    with tmpfs(tmp_path / "disk", 6 * weights // 1024) as disk:
        run = disk / "run"
        cmd = [sys.executable, "-m", "runners", "train", "scalerl", "--untracked", "--run-dir", str(run), *SETS]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=900)
        out = res.stdout + res.stderr
        assert res.returncode == 2, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        (line,) = [x for x in res.stderr.splitlines() if x.startswith("error:")]
        assert line.startswith(f"error: disk full: no space left on the filesystem of {run} (")
        assert "unexpected pos" in line or "iostream error" in line  # torch's words, kept
        assert "then re-run: it resumes from checkpoint-2" in line
        assert not (run / "checkpoints" / "checkpoint-4" / "prl_state.json").exists()

        remount(disk, "size=16m")  # space freed
        said: list[str] = []
        train(load_recipe("scalerl", TINY), run, log=said.append)
        assert any("skipping checkpoint-4: no prl_state.json" in m for m in said), said
        assert any(m.endswith(f"resuming from {run / 'checkpoints' / 'checkpoint-2'}") for m in said), said
        assert [r["step"] for r in metric_records(run / "metrics.jsonl")] == [0, 2, 4]
        assert (run / "done.json").is_file() and (run / "checkpoints" / "checkpoint-4" / "prl_state.json").is_file()


def test_a_full_disk_message_names_the_folder_and_keeps_other_errors(tmp_path):
    """ENOSPC anywhere in the chain is a full disk; a writer's 'unexpected pos' is one only when the
    folder's filesystem is (nearly) full; any other error is left alone."""
    import errno

    from runners.runfolder import disk_full

    with tmpfs(tmp_path / "disk", 1024) as disk:
        try:
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError as inner:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1 vs 2") from inner
        except RuntimeError as e:
            msg = str(disk_full(e, disk, "it resumes from checkpoint-2"))
        assert msg.startswith(f"disk full: no space left on the filesystem of {disk} (")
        assert "\n" not in msg and msg.endswith("then re-run: it resumes from checkpoint-2")
        unexpected = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1 vs 2")
        assert disk_full(unexpected, disk, "") is None  # 1 MiB free of 1 MiB: not full
        (disk / "ballast").write_bytes(b"\0" * 1000 * 1024)
        assert disk_full(unexpected, disk, "") is not None  # now it is
        assert disk_full(ValueError("shape mismatch"), disk, "") is None


@pytest.mark.parametrize("tracked", [False, True], ids=["untracked", "tracked"])
@pytest.mark.parametrize("exists", [True, False], ids=["existing-folder", "new-folder"])
def test_a_read_only_run_folder_is_refused_before_a_model_loads_or_a_run_is_made(
    tmp_path, monkeypatch, capsys, tracked, exists
):
    from runners.cli import main

    store = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    monkeypatch.chdir(tmp_path)
    with tmpfs(tmp_path / "ro", 1024) as ro:
        if exists:
            (ro / "run").mkdir()
            (ro / "run" / "metrics.jsonl").write_text("")
        remount(ro, "ro")
        args = ["train", "scalerl", "--run-dir", str(ro / "run"), *SETS] + ([] if tracked else ["--untracked"])
        try:
            assert main(args) == 2
        finally:
            os.environ.pop("MLFLOW_RUN_ID", None)  # a single tracked run names its MLflow run here
    err = capsys.readouterr().err.strip()
    verb = "write in" if exists else "create"
    assert err == (
        f"error: cannot {verb} the run folder {ro / 'run'}: Read-only file system; "
        "make it writable, or train into another folder (--run-dir)"
    )
    assert not store.exists() or not MlflowClient(f"sqlite:///{store}").search_runs(
        [e.experiment_id for e in MlflowClient(f"sqlite:///{store}").search_experiments()]
    )  # no MLflow run made for a run that cannot start


def test_an_untracked_rerun_with_nothing_to_resume_says_what_to_do(tiny_base, tmp_path, capsys):
    """Evaluations up to step 2 and a checkpoint-2 whose save was cut short (no prl_state.json),
    as a failed checkpoint leaves them: one line naming the folder and the way out."""
    from runners.cli import main
    from runners.recipe import load_recipe
    from runners.runfolder import claim

    run = tmp_path / "run"
    run.mkdir()
    claim(run, load_recipe("scalerl", TINY))  # the run's own folder, as its first launch left it
    (run / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint-2" / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "val/mean_at_16": 0.0}) + "\n" for s in (0, 2)))
    assert main(["train", "scalerl", "--untracked", "--run-dir", str(run), *SETS]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert line == (
        f"error: {run} has metrics up to step 2 but no complete checkpoint to resume from (checkpoint-2: no "
        "prl_state.json (its save was interrupted)); restarting from step 0 would splice a new run into its "
        "history. To start it over, delete the run folder or move it aside"
    )


@pytest.mark.parametrize("command", ["fit", "report"])
@pytest.mark.parametrize("name", ["curves.csv", "mlflow.db"])
def test_a_path_given_as_tracking_uri_is_one_line_naming_what_to_pass(tmp_path, monkeypatch, capsys, command, name):
    from analysis.cli import main

    monkeypatch.chdir(tmp_path)
    path = tmp_path / name
    path.write_text("variant,seed,x,y\n")
    ref = ["fit", "loo-cpu"] if command == "fit" else ["report", "latest"]
    assert main([*ref, "--tracking-uri", str(path), "--out", str(tmp_path / "out")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {path} is not a tracking URI: ")
    if name.endswith(".csv"):
        assert f"pass it as --curves {path}" in line
    else:
        assert f"name an SQLite store as sqlite:///{path} " in line


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_gpus_below_one_is_refused_at_parsing(value, capsys):
    from runners.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["train", "scalerl", "--gpus", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --gpus: " in err and ("pass 1 (one device, the default) or more" in err or "whole number" in err)


def test_gpus_one_or_more_still_parse():
    from runners.cli import build_parser

    assert build_parser().parse_args(["train", "scalerl"]).gpus == 1
    assert build_parser().parse_args(["train", "scalerl", "--gpus", "2"]).gpus == 2


def test_a_line_a_full_disk_cut_short_never_swallows_the_next(tmp_path):
    """A full disk cuts an evaluation's line in metrics.jsonl and samples.jsonl; after space is
    freed the re-run's line for that step starts on a line of its own, so readers skip only the
    cut one (before, the two were glued into one unreadable line and the step was lost)."""
    from runners.rl.train import metric_records
    from runners.runfolder import append_json_line
    from runners.tracking.run import samples_table

    pad = "x" * 2500
    with tmpfs(tmp_path / "disk", 8) as disk:  # two pages: one a file
        for name in ("metrics.jsonl", "samples.jsonl"):
            append_json_line(disk / name, {"step": 0, "samples": [{"completion": pad}]})
        for name in ("metrics.jsonl", "samples.jsonl"):
            path = disk / name
            with pytest.raises(OSError, match="No space left"), path.open("a") as fh:  # as the run wrote it
                fh.write(json.dumps({"step": 2, "samples": [{"completion": pad}]}) + "\n")
            assert not path.read_bytes().endswith(b"\n")  # cut short
        remount(disk, "size=64k")
        for name in ("metrics.jsonl", "samples.jsonl"):
            append_json_line(disk / name, {"step": 2, "samples": [{"completion": "again"}]})
        assert [r["step"] for r in metric_records(disk / "metrics.jsonl")] == [0, 2]
        assert samples_table(disk / "samples.jsonl")["completion"].tolist() == [pad, "again"]


@pytest.mark.slow
def test_sigterm_to_a_campaign_says_what_stopped_and_marks_its_runs_killed(store, tmp_path):
    """A campaign sent SIGTERM while its run trains stops it, marks the child run and the parent run
    KILLED (not left RUNNING until the next re-run), releases its lease, and says in one line what
    stopped and that a re-run resumes (exit 143). Before: it died silently of the signal."""
    import signal
    import time

    from tests.campaigns import trainers, write_campaign

    path = write_campaign(tmp_path / "termed.yaml", "termed", 40, {})
    camp = subprocess.Popen(
        [sys.executable, "-m", "runners", "campaign", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    root = tmp_path / "artifacts" / "campaigns" / "termed"
    deadline = time.time() + 600
    while not list(root.glob("baseline-*/metrics.jsonl")):  # its run trains: step 0 is evaluated
        assert camp.poll() is None and time.time() < deadline, camp.communicate()
        time.sleep(0.5)
    (folder,) = root.glob("baseline-*")
    assert trainers(str(folder))
    camp.send_signal(signal.SIGTERM)
    out, err = camp.communicate(timeout=300)
    assert camp.returncode == 128 + signal.SIGTERM, out[-2000:] + err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.strip()]
    assert line.startswith(
        "stopped: campaign termed stopped by SIGTERM: 1 run(s) stopped (baseline/seed0), marked KILLED"
    )
    assert line.endswith("stopped ones resume from their last checkpoint)"), line
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("termed")
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.info.status for r in runs) == ["KILLED", "KILLED"], [(r.info.run_name, r.info.status) for r in runs]
    assert "prl.lease" not in exp.tags
    assert not trainers(str(folder))  # the trainer stopped with it


def test_a_safetensors_save_that_fills_the_disk_is_a_full_disk(tmp_path):
    """safetensors' writer (a checkpoint's model.safetensors) on a real full disk raises
    ``SafetensorError: ... No space left on device (os error 28)`` and deletes the file it cut short,
    so the disk is no longer full when the error is read: it is still a full disk, one line naming
    the folder. Before: not read as one, a full traceback."""
    import torch
    from safetensors.torch import save_file

    from runners.runfolder import disk_full

    with tmpfs(tmp_path / "disk", 64) as disk:
        with pytest.raises(Exception, match="No space left on device") as raised:
            save_file({"w": torch.zeros(100_000)}, str(disk / "model.safetensors"))
        msg = str(disk_full(raised.value, disk, "it resumes from checkpoint-2"))
    assert msg.startswith(f"disk full: no space left on the filesystem of {disk} (")
    assert "SafetensorError: " in msg and msg.endswith("then re-run: it resumes from checkpoint-2"), msg


@pytest.mark.slow
def test_a_run_whose_disk_fills_inside_a_safetensors_save_is_one_line(tiny_base, tmp_path):
    """A real tiny run on a disk of 1.5x the weights: its step-0 best model fits, and the next
    weights written (best/ again at step 2, or checkpoint-2's model.safetensors) fill the disk inside
    safetensors' writer. One ``disk full:`` line naming the run folder, no traceback. Before: exit 1
    with safetensors' traceback (140 KiB of 564 KiB were free again when the error was read)."""
    weights = (tiny_base / "model.safetensors").stat().st_size
    with tmpfs(tmp_path / "disk", 3 * weights // 2 // 1024) as disk:
        run = disk / "run"
        cmd = [sys.executable, "-m", "runners", "train", "scalerl", "--untracked", "--run-dir", str(run), *SETS]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=900)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
        (line,) = [x for x in res.stderr.splitlines() if x.startswith("error:")]
        assert line.startswith(f"error: disk full: no space left on the filesystem of {run} ("), line
        assert "SafetensorError: " in line and "No space left on device" in line, line


def test_a_store_whose_disk_fills_at_creation_is_one_line_and_leaves_no_store(tmp_path):
    """A new store (``campaign --new-store``) on a disk too small for MLflow's tables: one ``disk
    full:`` line naming the folder, and no half-made mlflow.db left to be taken for a store. Before:
    a 104-line ``database or disk is full`` traceback and a 53 kB mlflow.db without all its tables."""
    from tests.campaigns import write_campaign

    path = write_campaign(tmp_path / "full.yaml", "full", 2, {})
    with tmpfs(tmp_path / "disk", 64) as disk:
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{disk}/store/mlflow.db"}
        cmd = [sys.executable, "-m", "runners", "campaign", str(path), "--new-store"]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
        (line,) = [x for x in res.stderr.splitlines() if x.startswith("error:")]
        assert line.startswith(f"error: disk full: no space left on the filesystem of {disk}/store ("), line
        assert "database or disk is full" in line and f"the half-made store {disk}/store/mlflow.db was removed" in line
        assert sorted(p.name for p in (disk / "store").glob("mlflow.db*") if "campaign.lock" not in p.name) == []

"""One run over two processes through accelerate (gloo on CPU): same semantics as one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from runners.recipe import RecipeError, load_recipe
from runners.rl.plan import trl_args

TINY = [
    "model.size=tiny",
    "batch.prompts=2",
    "batch.generations=4",
    "batch.micro_batch=8",
    "length.control=none",
    "length.max_tokens=16",
    "train.steps=2",
    "train.save_every=2",
    "eval.every=2",
    "eval.prompts=10",
    "eval.samples=4",
    "eval.batch_prompts=4",
]


def run(tmp_path, name: str, gpus: int) -> list[dict]:
    cmd = [sys.executable, "-m", "runners", "train", "scalerl", *[f"--set={s}" for s in TINY]]
    cmd += ["--run-dir", str(tmp_path / name), "--gpus", str(gpus)]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_processes_match_one_process_semantics(tmp_path, tiny_base):
    one, two = run(tmp_path, "one", 1), run(tmp_path, "two", 2)
    assert [r["step"] for r in two] == [r["step"] for r in one] == [0, 2]
    # every validation prompt evaluated exactly once, not once per process
    assert [r["val/prompts"] for r in two] == [r["val/prompts"] for r in one] == [10.0, 10.0]
    # the same global batch: 8 completions per step whatever the process count
    assert two[-1]["compute/samples"] == one[-1]["compute/samples"] == 16.0
    # device-hours count every process: 2 x the wall time of training
    for recs, devices in ((one, 1), (two, 2)):
        r = recs[-1]
        assert r["compute/gpu_hours"] == pytest.approx(devices * r["compute/train_seconds"] / 3600, rel=1e-9)
    assert (tmp_path / "two" / "done.json").is_file()
    # a single run is tracked like a campaign's: one MLflow run each (rank 0 only), finished, with its samples table
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("runs").experiment_id])
    assert len(runs) == 2 and all(r.data.tags["prl.done"] == "1" for r in runs)
    for r in runs:
        assert sorted(m.step for m in client.get_metric_history(r.info.run_id, "val/mean_at_16")) == [0, 2]
        assert "samples_table.json" in {a.path for a in client.list_artifacts(r.info.run_id)}
        assert r.data.params["train.steps"] == "2" and r.data.tags["prl.run_id"]


def test_world_size_splits_the_global_batch():
    r = load_recipe("scalerl", {"batch.micro_batch": 64})  # 256 rollouts, one update per step
    one, four = trl_args(r, 1), trl_args(r, 4)
    assert one["per_device_train_batch_size"] * one["gradient_accumulation_steps"] == 256
    assert four["per_device_train_batch_size"] * four["gradient_accumulation_steps"] * 4 == 256
    with pytest.raises(RecipeError, match="does not split over 3 processes"):
        trl_args(r, 3)

"""One run over two processes through accelerate (gloo on CPU): same semantics as one process."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from runners.recipe import RecipeError, load_recipe
from runners.rl.plan import trl_args
from tests.conftest import metrics_records, train_small_run


@pytest.mark.slow
@pytest.mark.xdist_group("ddp")  # with tests/test_fsdp.py, on the one worker that runs ddp_run
def test_two_processes_match_one_process_semantics(tmp_path, ddp_run):
    one, two = train_small_run(tmp_path / "one", 1), metrics_records(ddp_run)
    assert [r["step"] for r in two] == [r["step"] for r in one] == [0, 2, 4]
    # every validation prompt evaluated exactly once, not once per process
    assert [r["val/prompts"] for r in two] == [r["val/prompts"] for r in one] == [9.0, 9.0, 9.0]
    # the same global batch: 8 completions per step whatever the process count
    assert two[-1]["compute/samples"] == one[-1]["compute/samples"] == 32.0
    # device-hours count every process: 2 x the wall time of training
    for recs, devices in ((one, 1), (two, 2)):
        r = recs[-1]
        assert r["compute/gpu_hours"] == pytest.approx(devices * r["compute/train_seconds"] / 3600, rel=1e-9)
    assert (ddp_run / "done.json").is_file()
    # a single run is tracked like a campaign's: one MLflow run each (rank 0 only), finished, with its samples table
    for run_dir in (tmp_path / "one", ddp_run):
        client = MlflowClient(f"sqlite:///{run_dir.parent / 'mlflow.db'}")
        (run,) = client.search_runs([client.get_experiment_by_name("runs").experiment_id])
        assert run.data.tags["prl.done"] == "1"
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/mean_at_16")) == [0, 2, 4]
        assert "samples_table.json" in {a.path for a in client.list_artifacts(run.info.run_id)}
        assert run.data.params["train.steps"] == "4" and run.data.tags["prl.run_id"]


def test_world_size_splits_the_global_batch():
    r = load_recipe("scalerl", {"batch.micro_batch": 64})  # 256 rollouts, one update per step
    one, four = trl_args(r, 1), trl_args(r, 4)
    assert one["per_device_train_batch_size"] * one["gradient_accumulation_steps"] == 256
    assert four["per_device_train_batch_size"] * four["gradient_accumulation_steps"] * 4 == 256
    with pytest.raises(RecipeError, match="does not split over 3 processes"):
        trl_args(r, 3)

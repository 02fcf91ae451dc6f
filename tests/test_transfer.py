"""Moving results between machines: the wheel set for an offline target, and importing an MLflow store."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from runners.setup.wheelhouse import read_lock, select
from runners.tracking.store import IMPORTED_FROM
from runners.tracking.transfer import import_store
from tests.conftest import empty_store

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_set_is_the_pinned_closure_less_what_the_target_has():
    lock = read_lock(ROOT / "requirements.lock")
    everything = {p.split("==")[0]: p.split("==")[1] for p in select(lock, provided=set())}
    assert "torch" not in everything  # the target's own CUDA build
    assert {"trl", "transformers", "mlflow", "datasets", "scipy"} <= set(everything)
    assert all(lock[name] == version for name, version in everything.items())  # the tested versions
    assert "pytest" not in everything and "ruff" not in everything  # runtime only

    image = {"numpy", "scipy", "pandas", "transformers", "trl", "accelerate"}
    pins = {p.split("==")[0] for p in select(lock, provided=image)}
    assert {"numpy", "scipy", "pandas", "accelerate"}.isdisjoint(pins)  # provided: left out
    assert {"transformers", "trl"} <= pins  # the HF/RL stack travels whatever the target has

    with pytest.raises(SystemExit, match="not pinned"):
        select({k: v for k, v in lock.items() if k != "trl"}, provided=set())


def test_the_runtime_lock_is_what_runs_need_and_the_full_lock_adds_tests_lab_and_ray():
    """`make ablation` installs requirements.lock only (the set-up a newcomer waits for); the
    tools of `make test` / `make lab` and the Ray backend are pinned in requirements-full.lock."""
    runtime, full = read_lock(ROOT / "requirements.lock"), read_lock(ROOT / "requirements-full.lock")
    assert not set(runtime) & set(full)  # one pin per package
    assert {"pytest", "ruff", "jupyterlab", "nbclient", "ray"} <= set(full)
    assert not {"pytest", "ruff", "jupyterlab", "nbclient", "ray"} & set(runtime)
    select(runtime, provided=set())  # the runtime closure is pinned in the runtime lock alone
    assert "ray" in {
        p.split("==")[0]
        for p in select(
            read_lock(ROOT / "requirements.lock", ROOT / "requirements-full.lock"), provided=set(), extra=("ray",)
        )
    }


def make_source(uri: str, root: Path) -> tuple[str, str]:
    client = MlflowClient(uri)
    exp = client.create_experiment("camp", artifact_location=str(root / "mlruns"))
    parent = client.create_run(exp, run_name="camp", tags={"prl.kind": "campaign"})
    child = client.create_run(
        exp, run_name="baseline/seed0", tags={"mlflow.parentRunId": parent.info.run_id, "prl.run_id": "abc"}
    )
    cid = child.info.run_id
    client.log_batch(cid, params=[], metrics=[Metric("val/mean_at_16", 0.1 * s, 0, s) for s in range(5)])
    client.log_param(cid, "algorithm.loss", "cispo")
    f = root / "metrics.jsonl"
    f.write_text('{"step": 0}\n')
    client.log_artifact(cid, str(f))
    client.set_terminated(cid)
    client.set_terminated(parent.info.run_id)
    return parent.info.run_id, cid


@pytest.mark.slow
def test_import_copies_runs_structure_histories_and_artifacts_once(tmp_path, store_template):
    src, dst = empty_store(store_template, tmp_path / "src.db"), empty_store(store_template, tmp_path / "dst.db")
    parent_id, child_id = make_source(src, tmp_path)
    counts = import_store(src, dst, log=lambda m: None)
    assert counts["runs"] == 2 and counts["metrics"] == 5

    client = MlflowClient(dst)
    exp = client.get_experiment_by_name("camp")
    runs = {r.data.tags[IMPORTED_FROM]: r for r in client.search_runs([exp.experiment_id])}
    child, parent = runs[child_id], runs[parent_id]
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id  # remapped to the copy
    assert child.data.tags["prl.run_id"] == "abc" and child.data.params["algorithm.loss"] == "cispo"
    hist = sorted((m.step, m.value) for m in client.get_metric_history(child.info.run_id, "val/mean_at_16"))
    assert hist == [(s, pytest.approx(0.1 * s)) for s in range(5)]
    assert [a.path for a in client.list_artifacts(child.info.run_id)] == ["metrics.jsonl"]
    assert child.info.status == "FINISHED"

    again = import_store(src, dst, log=lambda m: None)
    assert again["runs"] == 0 and again["skipped"] == 2


def test_import_cli_errors_before_touching_anything(tmp_path, cli):
    def run_import(source: Path, shell: bool = False) -> subprocess.CompletedProcess:
        args = ["import", str(source), "--tracking-uri", f"sqlite:///{tmp_path}/d.db"]
        if shell:  # the real process's exit code and stderr
            return subprocess.run([sys.executable, "-m", "runners", *args], capture_output=True, text=True)
        return cli("runners", *args)

    res = run_import(tmp_path / "missing.db")
    assert res.returncode == 2 and "no MLflow store at" in res.stderr and "(no such file)" in res.stderr
    (tmp_path / "notes.db").write_text("not a database\n")
    res = run_import(tmp_path / "notes.db", shell=True)
    assert res.returncode == 2 and "not an SQLite database" in res.stderr and "Traceback" not in res.stderr
    with sqlite3.connect(tmp_path / "other.db") as db:  # another program's database: MLflow would migrate it
        db.execute("CREATE TABLE t (x)")
    res = run_import(tmp_path / "other.db")
    assert res.returncode == 2 and "without MLflow's tables" in res.stderr
    with sqlite3.connect(tmp_path / "other.db") as db:
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["t"]  # left as it was
    assert not (tmp_path / "d.db").exists()

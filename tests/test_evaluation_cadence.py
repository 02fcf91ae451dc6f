"""How often a run evaluates does not change how it trains: evaluation samples from a seed of its own
and then restores training's random stream (``runners/task/evaluation.py``), so a run evaluated every
second step logs, at the steps it shares with one evaluated every step, the very same numbers. The
default campaign rests on it: its evaluation every 20 steps was chosen on runs evaluated every 10,
thinned (experiments/campaigns/loo-cpu.yaml, results/loo-cpu/seed-groups.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SMALL_RUN, cpu_only_env, metrics_records

ROOT = Path(__file__).resolve().parent.parent


def _evaluations(run_dir: Path, every: int) -> dict[int, dict]:
    """``runners train`` of :data:`SMALL_RUN` evaluated every ``every`` steps: its records by step."""
    sets = [s for s in SMALL_RUN if not s.startswith("eval.every=")] + [f"eval.every={every}"]
    sets.append("data.reward={exact_match: 1.0, format: 0.5}")  # rewards that vary, so every step trains
    cmd = [sys.executable, "-m", "runners", "train", "scalerl", *[f"--set={s}" for s in sets]]
    res = subprocess.run(
        [*cmd, "--untracked", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env=cpu_only_env(),
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return {r["step"]: r for r in metrics_records(run_dir)}


@pytest.mark.slow
def test_a_run_evaluated_half_as_often_trains_and_scores_the_same(tmp_path, tiny_base):
    dense, sparse = _evaluations(tmp_path / "every1", 1), _evaluations(tmp_path / "every2", 2)
    assert sorted(dense) == [0, 1, 2, 3, 4] and sorted(sparse) == [0, 2, 4]
    for step in (2, 4):  # after one and after three evaluations more in the dense run
        scores = {k: v for k, v in sparse[step].items() if k.startswith("val/") and "second" not in k}  # not timings
        assert scores and scores == {k: dense[step][k] for k in scores}, (step, scores, dense[step])

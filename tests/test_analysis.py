"""The LOO table from curves: fits per variant (seeds pooled), the paper's rule, noise-aware verdicts."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.loo import fit_table, to_markdown
from scalefit.synthetic import synthetic_curve


def curves(spec: dict[str, tuple[float, float, float]], seeds=(0, 1)) -> pd.DataFrame:
    rows = []
    for i, (variant, (cm, b, a)) in enumerate(spec.items()):
        for s in seeds:
            c, v = synthetic_curve(cm, b, a, c_max=16_000.0, n_points=81, seed=100 * i + s)
            rows.append(
                pd.DataFrame(
                    {
                        "variant": variant,
                        "axis": variant.split("=")[0],
                        "seed": s,
                        "step": range(len(c)),
                        "compute/gpu_hours": c,
                        "val/mean_at_16": v,
                    }
                )
            )
    return pd.concat(rows, ignore_index=True)


def test_loo_table_verdicts_follow_the_papers_rule():
    df = curves({"baseline": (2542, 1.92, 0.61), "loss=worse": (2542, 1.92, 0.52), "agg=same": (2542, 1.92, 0.61)})
    table, extra = fit_table(df, {"a_grid": "0.30:0.90:0.005", "exclude_below": 1500}, n_boot=200)
    t = table.set_index("variant")
    assert abs(t.loc["baseline", "A"] - 0.61) <= 0.015 and t.loc["baseline", "seeds"] == 2  # auto C_mid grid
    assert t.loc["baseline", "A_seed_half_range"] <= 0.02
    assert t.loc["loss=worse", "verdict"].startswith("worse asymptote")
    assert "not significant" not in t.loc["loss=worse", "verdict"]
    assert t.loc["agg=same", "verdict"].startswith(("no measurable difference", "tie"))
    md = to_markdown(table)
    assert md.count("\n") == 2 + 3 and "| loss=worse |" in md


def test_unfittable_variant_is_reported_not_raised():
    df = curves({"baseline": (2542, 1.92, 0.61)})
    flat = df.copy()
    flat["variant"], flat["val/mean_at_16"] = "ppo=on", 0.30
    table, _ = fit_table(pd.concat([df, flat]), {"a_grid": "0.30:0.90:0.005"}, n_boot=100)
    note = table.set_index("variant").loc["ppo=on", "note"]
    assert "no sigmoid gain" in note


# --- run reports: anomaly detection on known series ---------------------------------------


def test_anomaly_detectors_find_what_was_planted_and_nothing_else():

    from analysis.report import find_anomalies

    steps = range(1, 61)
    rng = np.random.default_rng(0)
    reward = pd.Series(0.3 + 0.005 * np.arange(60) + rng.normal(0, 0.01, 60), index=steps)
    clean = {
        "train/reward": reward,
        "train/entropy": pd.Series(np.linspace(0.9, 0.5, 60), index=steps),
        "train/completions/clipped_ratio": pd.Series(0.02, index=steps),
        "val/mean_at_16": pd.Series([0.40, 0.45, 0.50, 0.52, 0.53], index=[0, 15, 30, 45, 60]),
        "train/nonfinite_values": pd.Series(0.0, index=steps),
    }
    assert find_anomalies(clean, n_val_prompts=1000) == []

    bad = dict(clean)
    bad["train/reward"] = reward.copy()
    bad["train/reward"][30] -= 0.4  # a dip
    bad["train/completions/clipped_ratio"] = pd.Series([0.02] * 40 + [0.25] * 20, index=steps)
    bad["train/entropy"] = pd.Series(np.r_[np.linspace(0.9, 0.5, 50), [0.05] * 10], index=steps)
    bad["val/mean_at_16"] = pd.Series([0.40, 0.45, 0.50, 0.38, 0.53], index=[0, 15, 30, 45, 60])
    bad["train/nonfinite_values"] = pd.Series([0.0] * 55 + [1.0] * 5, index=steps)
    found = {f.kind: f.text for f in find_anomalies(bad, n_val_prompts=1000)}
    assert found.keys() == {"reward dip", "truncation", "entropy collapse", "validation regression", "NaN/inf"}
    assert found["reward dip"].startswith("step 30:")
    assert "steps 41–60" in found["truncation"] and "25%" in found["truncation"]
    assert "step 51" in found["entropy collapse"]
    assert found["validation regression"].startswith("step 45: mean@16 0.380, 0.120 below")
    assert "56–60" in found["NaN/inf"]


def test_report_cli_names_a_missing_run(tmp_path):
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "analysis", "report", "nosuch/seed0", "--tracking-uri", f"sqlite:///{tmp_path}/m.db"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and "no run with id or name 'nosuch/seed0'" in res.stderr

"""The LOO table from curves: fits per variant (seeds pooled), the paper's rule, noise-aware verdicts."""

from __future__ import annotations

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

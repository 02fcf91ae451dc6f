"""A call for arms that have no fit (scalefit.decide.bounded through analysis.table.calls): a variant below
the baseline by more than any rise the campaign has shown in one doubling is "worse", at half the
budget and at the budget; a smaller deficit, or a lead, gets no such call."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from analysis.fits import campaign_model
from analysis.table import calls
from runners.campaign.spec import fit_settings
from runners.contract import MEAN_AT_16
from scalefit.data.synthetic import campaign_runs
from scalefit.decide.bounded import largest_rise

X = "compute/samples"


def _campaign() -> pd.DataFrame:
    """A rising baseline and a rising variant (3 seeds each), and three arms flat or falling from
    their first evaluation: one at the base model's level (no sigmoid gain: no fit), far below the
    baseline; one a little below the baseline at half the budget; one far above it and falling (an
    arm that led, then collapsed)."""
    truth = {"baseline": (3000, 1.9, 0.65), "loss=same": (3000, 1.9, 0.655)}
    df = campaign_runs(truth, seeds=3, c_max=15_000, n_points=25, drift_sd=0.005, seed_sd=0.005, seed=3)
    rng = np.random.default_rng(0)
    base = df[df["variant"] == "baseline"]
    level = float(base.loc[base["compute"].between(7000, 8000), "value"].mean())  # the baseline at half
    for name, start, end in (("think=flat", 0.31, 0.30), ("think=near", level - 0.02, level - 0.08), ("ppo", 0.9, 0.7)):
        arm = base.assign(variant=name)
        t = arm["compute"] / arm["compute"].max()
        arm["value"] = np.where(arm["compute"] > 0, start + (end - start) * t + rng.normal(0, 0.004, len(arm)), 0.3)
        df = pd.concat([df, arm], ignore_index=True)
    df["value"] = df["value"].where(df["compute"] > 0, df.loc[df["compute"] == 0, "value"].mean())
    df["step"] = df.groupby(["variant", "seed"]).cumcount() * 10
    df["run"] = df["variant"] + "/seed" + df["seed"].astype(str)
    return df.rename(columns={"compute": X, "value": MEAN_AT_16}).assign(axis=df["variant"])


def test_a_clear_loser_with_no_fit_is_worse_and_nothing_else_is_called_from_the_data():
    df = _campaign()
    cfg = fit_settings({"a_grid": "0.30:0.95:0.005"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full, half = campaign_model(df, cfg, 60), campaign_model(df, cfg, 60, fraction=0.5)
    assert "think=flat" not in half.forecasts and "think=flat" not in full.forecasts  # no curve describes it
    plain = calls(full, half, cfg.margin).set_index("variant")
    assert plain.loc["think=flat", "half_call"] == plain.loc["think=flat", "call"] == "cannot tell yet"
    bounded = calls(full, half, cfg.margin, df, X).set_index("variant")
    flat = bounded.loc["think=flat"]
    assert flat["half_call"] == "worse" and flat["call"] == "worse"
    assert flat["half_call_text"].startswith("worse (bounded from the data): Δ -0.")
    assert "measured at half the budget; no arm rose more than" in flat["half_call_text"]
    runs = {
        v: [(gs[X].to_numpy(float), gs[MEAN_AT_16].to_numpy(float)) for _, gs in g.groupby("seed")]
        for v, g in df.groupby("variant")
    }
    rise = largest_rise(runs, {v: 0.5 * df[X].max() for v in runs})
    assert 0.05 < rise < flat["half_call_delta"] * -1 - cfg.margin  # the deficit is beyond any rise
    near = bounded.loc["think=near"]  # 0.04 below at half: a doubling's rise could close it; not at the budget
    assert near["half_call"] == plain.loc["think=near", "half_call"] != "worse"
    assert near["call"] == "worse" and near["call_text"].endswith("measured at the budget, below -0.02")
    for arm in ("ppo", "loss=same"):  # far above and falling: never "better" from the data; a fitted arm's calls stand
        assert bounded.loc[arm, ["half_call", "call"]].tolist() == plain.loc[arm, ["half_call", "call"]].tolist()

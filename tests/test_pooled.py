"""The joint campaign fit, its forecast and the seed planner, on synthetic campaigns with known truth."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from analysis.planner import plan, resolvable, seeds_per_arm
from runners.campaign.spec import CampaignError, fit_settings
from runners.contract import MEAN_AT_16
from scalefit import fit_sigmoid, forecast
from scalefit.data.synthetic import campaign_runs
from scalefit.defaults import DEFAULT_MARGIN
from scalefit.forecasts.interface import MIN_BACKTESTS, Backtest, call_difference, score_backtest
from scalefit.forecasts.pooled import campaign_bootstrap, forecast_campaign
from scalefit.forecasts.pooled_fit import fit_campaign
from scalefit.forecasts.seeds import deviation_pool
from scalefit.models.curve import sigmoid

A_GRID = np.round(np.arange(0.05, 1.0, 0.005), 3)


def _curves(df: pd.DataFrame) -> dict:
    return {v: (g["compute"].to_numpy(), g["value"].to_numpy(), g["seed"].to_numpy()) for v, g in df.groupby("variant")}


def _fit(df: pd.DataFrame, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit_campaign(_curves(df), a_grid=A_GRID, **kw)


def test_pooling_recovers_a_shared_B_that_each_curve_alone_cannot_pin():
    rng = np.random.default_rng(3)
    truth = {f"v{i}": (3000 * rng.uniform(0.7, 1.5), 1.9, rng.uniform(0.55, 0.75)) for i in range(8)}
    df = campaign_runs(truth, seeds=2, c_max=7000, n_points=21, drift_sd=0.01, seed_sd=0.01, seed=3)
    pooled, alone = _fit(df), _fit(df, pooling="none")
    err_pooled = np.array([np.log(pooled.fits[v].B / 1.9) for v in truth])
    err_alone = np.array([np.log(alone.fits[v].B / 1.9) for v in truth])
    assert pooled.mu is not None and abs(pooled.mu - np.log(1.9)) < 0.15  # within 3 se of 8 variants
    assert np.sqrt(np.mean(err_pooled**2)) < np.sqrt(np.mean(err_alone**2))
    assert np.std(err_pooled) < 0.5 * np.std(err_alone)  # alone, drift moves each B; pooled, they agree
    assert pooled.r0_shared and set(pooled.pooled) == set(truth)
    assert "B pooled over 8 variants" in pooled.describe() and "R0" in pooled.describe()
    assert alone.describe().startswith("pooling none")


def test_a_bootstrap_with_every_variant_left_out_draws_nothing_and_warns_nothing():
    """A backtest's prefix where no variant has a band skips them all: no draws, and no numpy
    "Mean of empty slice" on the user's terminal (it was printed by `analysis fit` of a
    400-step loo-cpu)."""
    truth = {"a": (3000, 1.8, 0.7), "b": (3000, 1.8, 0.68)}
    cfit = _fit(campaign_runs(truth, seeds=2, c_max=20_000, n_points=21, seed=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert campaign_bootstrap(cfit, deviation_pool(cfit.fits), 8, skip=frozenset(truth)) == {}


def test_variants_whose_B_truly_differs_keep_their_own():
    truth = {"slow": (3000, 1.0, 0.65), "mid": (3000, 1.7, 0.6), "fast": (3000, 3.0, 0.65)}
    df = campaign_runs(truth, seeds=2, c_max=30_000, n_points=41, drift_sd=0.005, seed_sd=0.005, seed=1)
    pooled = _fit(df)
    for v, (_, b, _) in truth.items():
        assert abs(pooled.fits[v].B / b - 1) < 0.1, (v, pooled.fits[v].B)
    assert pooled.tau > 0.3  # the data say the variants differ: little shrinkage


def _collapse(df: pd.DataFrame, name: str, peak: float, drop_per_unit: float) -> pd.DataFrame:
    """A variant that rises like the others, then falls after ``peak`` compute."""
    g = df[df["variant"] == "v0"].copy()
    g["variant"] = name
    g["value"] -= drop_per_unit * np.clip(g["compute"] - peak, 0, None)
    return pd.concat([df, g], ignore_index=True)


def test_a_rise_and_collapse_gets_no_band_and_the_verdict_says_why():
    truth = {"v0": (3000, 1.9, 0.65), "v1": (3500, 1.9, 0.62), "v2": (2500, 1.9, 0.68)}
    df = campaign_runs(truth, seeds=2, c_max=12_000, n_points=25, drift_sd=0.004, seed_sd=0.004, seed=2)
    df = _collapse(df, "collapse", peak=6000, drop_per_unit=0.15 / 6000)
    cfit = _fit(df)
    fcs = forecast_campaign(cfit, n_resamples=100, backtest=False)
    fc = fcs["collapse"]
    assert fc.no_band and not fc.verdict.predictable
    assert "no band: rises then falls" in fc.verdict.text()
    lo, hi = fc.prediction_band([20_000])
    assert np.isnan(lo).all() and np.isnan(hi).all() and np.isnan(fc.interval("A")).all()
    assert fc.expected_error is None
    assert call_difference(fc, fcs["v0"], 12_000).label == "cannot tell yet"
    assert not fcs["v0"].no_band  # the sigmoids beside it keep their bands
    assert np.isfinite(fcs["v0"].prediction_band([20_000])[0]).all()


def test_a_step_with_B_on_its_bound_gets_no_band():
    truth = {"v0": (3000, 1.9, 0.65), "v1": (3500, 1.9, 0.62), "v2": (2500, 1.9, 0.68)}
    df = campaign_runs(truth, seeds=2, c_max=12_000, n_points=25, drift_sd=0.004, seed_sd=0.004, seed=4)
    step = df[df["variant"] == "v0"].copy()
    step["variant"] = "step"
    step["value"] = np.where(step["compute"] >= 5000, 0.7, 0.3) + np.random.default_rng(0).normal(0, 0.003, len(step))
    step.loc[step["compute"] == 0, "value"] = df.loc[df["compute"] == 0, "value"].iloc[0]
    fcs = forecast_campaign(_fit(pd.concat([df, step])), n_resamples=100, backtest=False)
    text = fcs["step"].verdict.text()
    assert fcs["step"].no_band and "on a bound of its range" in text, text


def test_old_backtests_are_scored_against_the_noise_of_a_k_run_mean():
    cm, b, a = 2542, 1.92, 0.61
    c = np.tile(np.linspace(0, cm * 8, 41), 3)
    runs = np.repeat([0, 1, 2], 41)
    v = sigmoid(c, a, b, cm, 0.3) + np.random.default_rng(0).normal(0, 0.01, len(c))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fc = forecast(fit_sigmoid(c, v, runs=runs, a_grid=A_GRID), n_resamples=100, backtest=False)
    s = fc.noise.sigma
    # each backtest missed by one run's sigma, on the mean of three runs (whose noise is sigma / sqrt 3)
    fc.backtests = [Backtest(o, 2 * o, 0.5 + s, 0.5, s, 2.0, n_runs=3) for o in (1000.0, 2000.0, 4000.0)]
    assert fc.expected_error == pytest.approx(s * np.sqrt(1 - 1 / 3), rel=1e-6)  # one run's sigma^2 gave 0


def test_a_k_seed_band_carries_sigma_squared_over_k():
    truth = {"v0": (3000, 1.9, 0.65), "v1": (3500, 1.9, 0.62), "v2": (2500, 1.9, 0.68)}
    df = campaign_runs(truth, seeds=3, c_max=12_000, n_points=25, drift_sd=0.01, seed_sd=0.01, seed=5)
    fc = forecast_campaign(_fit(df), n_resamples=400, backtest=False)["v0"]
    t = [24_000.0]
    a, b, floor = fc.noise_var[1]
    # the run's variance at twice the fitted range: its line, or a random walk's growth if faster
    per_run = max(a + b * 2.0, floor + (a + b - floor) * 2.0)
    v1, v4 = np.var(fc.target_draws(t, 1)), np.var(fc.target_draws(t, 4))
    assert per_run > 0 and v1 - v4 == pytest.approx(per_run * (1 - 1 / 4), rel=0.25)
    assert fc.expected_error_at(t, 4) < fc.expected_error_at(t, 1)


def test_the_seeds_noise_past_the_data_grows_at_least_as_a_random_walk():
    """Issue 58: a pool whose variance line is flat (slope 0) gave the noise at 2x equal to the noise
    at 1x; past the data the part above the evaluation's floor now grows in proportion to compute."""
    truth = {"v0": (3000, 1.9, 0.65), "v1": (3500, 1.9, 0.62), "v2": (2500, 1.9, 0.68)}
    df = campaign_runs(truth, seeds=3, c_max=12_000, n_points=25, drift_sd=0.0, seed_sd=0.01, seed=5)
    fc = forecast_campaign(_fit(df), n_resamples=100, backtest=False)["v0"]
    fc.noise_var = {1: (0.0004, 0.0, 0.0001), 3: (0.0003, 0.0, 0.0001 / 3)}  # flat lines, as on loo-gpu7's replicate
    fc.shared_var = 0.0
    c_fit = float(fc.fit.compute.max())
    at_1, at_2, at_4 = (fc.noise_sd(c_fit * r, 1) for r in (1.0, 2.0, 4.0))
    assert at_1 == pytest.approx(0.02)  # within the data: the line
    assert at_2 == pytest.approx(np.sqrt(0.0001 + 0.0003 * 2)) and at_4 == pytest.approx(np.sqrt(0.0001 + 0.0003 * 4))
    fc.noise_var = {1: (0.0001, 0.0009, 0.0001), 3: (0.0001, 0.0009, 0.0001)}  # a line steeper than the walk: kept
    assert fc.noise_sd(c_fit * 2, 1) == pytest.approx(np.sqrt(0.0001 + 0.0009 * 2))


def test_the_shape_error_is_additive_and_can_narrow_the_fit_but_never_the_seeds():
    """calibrate: backtests that missed by more than they claimed add a shape error; ones that landed
    closer take variance from the fit's spread (not below zero), never from the seeds' noise."""
    from scalefit.forecasts.interface import SHAPE_PRIOR_SD, SHAPE_PRIOR_WEIGHT, Calibration, calibrate

    def bts(err: float, sd: float, n: int = 40) -> list[Backtest]:
        return [Backtest(1000.0, 2000.0, 0.5 + err * (-1) ** i, 0.5, sd, 2.0, 2) for i in range(n)]

    prior = SHAPE_PRIOR_WEIGHT * SHAPE_PRIOR_SD**2
    wide = calibrate(bts(0.05, 0.02))
    assert wide.shape_var == pytest.approx((prior + 40 * (0.05**2 - 0.02**2)) / (SHAPE_PRIOR_WEIGHT + 40))
    close = calibrate(bts(0.0, 0.05))
    assert close.shape_var < 0 and close.backtests == 40
    assert calibrate([]).shape_var == pytest.approx(SHAPE_PRIOR_SD**2)  # no backtest: the prior
    near = [Backtest(1000.0, 1200.0, 0.6, 0.5, 0.01, 2.0, 2)]  # 1.2x ahead for a 2x question: another question
    assert calibrate(near).backtests == 0
    rng = np.random.default_rng(0)
    fit_dev, noise = rng.normal(0, 0.01, (20_000, 1)), rng.normal(0, 0.02, (20_000, 1))
    point = np.zeros((1, 1))
    shrunk = Calibration(-0.00005, 10).widen(point, fit_dev, noise, [2000.0], 1000.0, 0)
    assert np.var(shrunk) == pytest.approx(0.00005 + 0.02**2, rel=0.05)  # the fit's variance halved, the seeds' kept
    floored = Calibration(-0.0004, 10).widen(point, fit_dev, noise, [2000.0], 1000.0, 0)
    assert np.var(floored) == pytest.approx(0.25 * 0.01**2 + 0.02**2, rel=0.05)  # the fit's sd halved at most
    grown = Calibration(0.0009, 10).widen(point, fit_dev, noise, [4000.0], 1000.0, 0)  # 2 doublings past
    assert np.var(grown) == pytest.approx(0.01**2 + 0.02**2 + 4 * 0.0009, rel=0.05)
    inside = Calibration(0.0009, 10).widen(point, fit_dev, noise, [800.0], 1000.0, 0)
    assert np.var(inside) == pytest.approx(0.01**2 + 0.02**2, rel=0.05)  # within the data: no shape error


def test_a_backtest_is_scored_on_the_questions_target_the_mean_of_the_last_w():
    truth = {"v0": (3000, 1.9, 0.65), "v1": (3500, 1.9, 0.62), "v2": (2500, 1.9, 0.68)}
    df = campaign_runs(truth, seeds=3, c_max=12_000, n_points=25, drift_sd=0.01, seed_sd=0.01, seed=5)
    cfit = _fit(df)
    fc = forecast_campaign(cfit, n_resamples=100, backtest=False)["v0"]
    f = cfit.fits["v0"]
    c = np.unique(f.compute)
    (origin,) = c[c <= c.max() / 2][-1:]
    bt = score_backtest(fc, float(origin), f.compute, f.value, 2.0, window=3)
    last3 = np.unique(f.compute[(f.compute > origin) & (f.compute <= bt.target)])[-3:]
    assert bt.observed == pytest.approx(np.mean([f.value[f.compute == x].mean() for x in last3]))
    assert bt.predicted == pytest.approx(float(f.predict(last3).mean()))
    assert bt.n_runs == 3


def _planner_campaign(seed_sd: float, seeds: int = 4, variants: int = 8) -> pd.DataFrame:
    truth = {f"v{i}": (3000, 1.9, 0.6 + 0.01 * i) for i in range(variants)}
    truth["baseline"] = (3000, 1.9, 0.6)
    df = campaign_runs(truth, seeds=seeds, c_max=12_000, n_points=21, n_prompts=20_000, drift_sd=0.0, seed_sd=seed_sd)
    df["step"] = df.groupby(["variant", "seed"]).cumcount() * 10
    return df.rename(columns={"compute": "x", "value": MEAN_AT_16})


def test_the_planner_recovers_a_known_seed_spread_and_its_numbers_follow():
    df = _planner_campaign(seed_sd=0.02)
    p = plan(df, "x", margin=0.02, last_k=3)
    s = p.spread[1.0]
    assert s.dof == 9 * 3
    lo, hi = s.ci("final")
    assert lo < 0.02 < hi and 0.014 < s.sd_final < 0.027
    assert s.sd_last_k == pytest.approx(s.sd_final, rel=0.15)  # a constant offset does not average out
    assert p.noise["white"] < 0.005  # 20,000 prompts: almost no evaluation noise
    assert resolvable(0.02, 2, 3) == pytest.approx(2.8016 * 0.02 * np.sqrt(1 / 2 + 1 / 3), rel=1e-3)
    assert seeds_per_arm(0.02, 0.02) == 16 and seeds_per_arm(0.019, 0.02) == 15
    row = next(r for r in p.rows if r["variant"] == "v1")
    assert row["resolvable"] == pytest.approx(resolvable(s.sd_final, 4, 4))
    assert "seeds per arm for a ±0.02 difference" in p.text()


def test_plan_command_reads_a_published_curves_csv_and_refuses_a_bad_margin(cli):
    cmd = ["plan", "loo-gpu4", "--curves", "results/loo-gpu4/curves.csv"]
    out = cli("analysis", *cmd)
    assert out.returncode == 0, out.stderr
    assert "seed spread at the budget: sd 0.0135" in out.stdout and "seeds per arm" in out.stdout
    bad = cli("analysis", *cmd, "--margin", "2")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--margin" in bad.stderr


def test_pooling_and_last_k_settings_are_checked():
    assert fit_settings(None).pooling == "partial" and fit_settings(None).last_k == 3
    with pytest.raises(CampaignError, match="fit.pooling = 'full'.*partial.*none"):
        fit_settings({"pooling": "full"})
    with pytest.raises(CampaignError, match="fit.last_k = 0"):
        fit_settings({"last_k": 0})


def test_the_loo_table_says_which_fit_it_used_and_pooling_none_keeps_the_per_variant_fit():
    from analysis.loo import fit_table, to_markdown

    truth = {"baseline": (3000, 1.9, 0.65), "loss=a": (3500, 1.9, 0.62), "loss=b": (2500, 1.9, 0.70)}
    df = campaign_runs(truth, seeds=2, c_max=12_000, n_points=21, drift_sd=0.005, seed_sd=0.005, seed=6)
    df["step"] = df.groupby(["variant", "seed"]).cumcount() * 10
    df = df.rename(columns={"compute": "compute/samples", "value": MEAN_AT_16}).assign(axis="loss")
    settings = {"a_grid": "0.30:0.95:0.005"}
    pooled, _ = fit_table(df, fit_settings(settings), n_boot=60)
    alone, extra = fit_table(df, fit_settings({**settings, "pooling": "none"}), n_boot=60)
    assert to_markdown(pooled).startswith("Fit: pooling partial: B pooled over 3 variants")
    assert to_markdown(alone).startswith("Fit: pooling none")
    assert pooled.set_index("variant")["pooled"].str.startswith("pooled (campaign B").all()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        own = fit_sigmoid(
            *(df.loc[df["variant"] == "loss=a", c] for c in ("compute/samples", MEAN_AT_16)),
            a_grid=extra["fits"]["loss=a"].a_grid,
            runs=df.loc[df["variant"] == "loss=a", "seed"],
        )
    assert alone.set_index("variant").loc["loss=a", "B"] == own.B  # none: exactly the per-variant fit
    for col in ("half_call", "call", "resolvable", "resolvable_last_k", "measured_last3"):
        assert col in pooled, col


def test_an_extrapolated_call_needs_a_bounded_asymptote_and_a_checked_extrapolation():
    """Past its fitted data a difference is the fit's guess until the campaign has checked its
    extrapolations (loo-cpu40 called four variants "worse" by 0.12 from before the knee; at the
    budget they were no different). Fitted past the knee, with A bounded, but before any backtest
    past the knee: the resamples put the difference wholly beyond the margin, and the unchecked
    extrapolation alone holds the call back, so losing that rule shows as a call, whatever the
    reason says. With backtests past the knee the same difference is called."""
    budget = 40_000.0
    truth = {"baseline": (8000, 1.9, 0.70), "worse": (8000, 1.9, 0.55), "v2": (8000, 1.9, 0.65), "v3": (8000, 1.9, 0.6)}
    df = campaign_runs(truth, seeds=2, c_max=budget, n_points=41, drift_sd=0.004, seed_sd=0.004, seed=2)

    def call(upto: float):
        """The call of "worse" against the baseline at the budget, fitted up to ``upto``; the
        campaign's backtests past the knee; whether the resamples put the difference below -margin."""
        fcs = forecast_campaign(
            _fit(df, fit_upto=dict.fromkeys(truth, upto)), target=dict.fromkeys(truth, budget), n_resamples=200
        )
        d = fcs["worse"].mean_draws([budget])[:, 0] - fcs["baseline"].mean_draws([budget])[:, 0]
        beyond = bool(np.percentile(d, 97.5) < -DEFAULT_MARGIN)
        return call_difference(fcs["worse"], fcs["baseline"], budget), fcs["baseline"].campaign_backtests, beyond

    early, backtests, beyond = call(12_000)  # 1.5x the knee, extrapolated 3.3x
    assert backtests < MIN_BACKTESTS and beyond, (backtests, early)
    assert early.label == "cannot tell yet" and "not bounded" not in early.reason, early
    late, backtests, _ = call(20_000)  # well past the knee, extrapolated 2x, checked and bounded: called
    assert backtests >= MIN_BACKTESTS and late.label == "worse" and late.hi < -0.02, late


def test_the_bootstrap_draws_of_a_pooled_B_centre_on_its_fit_and_are_not_stuck_on_grid_nodes():
    """The resamples' log B profile is coarse (15 nodes); a linear interpolation of it peaks on a
    node, so every draw of a sharply pinned B fell on one node, off the fitted B, and A moved to make
    up for it: a narrow band around the wrong centre. The draws must spread around the fit."""
    rng = np.random.default_rng(2)
    truth = {
        f"v{i}": (10_000 * rng.uniform(0.7, 1.5), 2.0 * rng.choice([1.0, 0.6]), rng.uniform(0.55, 0.75))
        for i in range(6)
    }
    df = campaign_runs(truth, seeds=2, c_max=60_000, n_points=21, drift_sd=0.005, seed_sd=0.005, seed=2)
    cfit = _fit(df, fit_upto=30_000)
    fcs = forecast_campaign(cfit, n_resamples=200, backtest=False)
    assert len(cfit.pooled) == len(truth)
    for v in truth:
        b = fcs[v].samples[:, 1]
        assert len(np.unique(np.round(b, 6))) >= 5, (v, np.unique(b))
        assert abs(np.median(np.log(b)) - np.log(cfit.fits[v].B)) < 0.05, (v, np.median(b), cfit.fits[v].B)
        assert abs(np.median(fcs[v].samples[:, 0]) - cfit.fits[v].A) < 0.01, v


def test_a_half_budget_call_the_variant_own_fit_does_not_back_is_not_made():
    """Slower, not lower (issue #40): same A as the baseline, a later C_mid and a lower B, as
    loo-gpu3…5's lr_half. From half the budget the joint fit's prior pulls its B towards the
    campaign's, which lowers its ceiling, and its paired draws put the difference at the budget
    wholly below -margin: "worse", Δ -0.045 [-0.060, -0.028] (the call before this rule). Fitted
    alone the variant's data leave it open, and its forecast is not predictable, so the call is
    "cannot tell yet" and says so, the joint fit's call beside it. A variant whose ceiling is lower
    is still called worse."""
    budget = 40_000.0
    truth = {
        "baseline": (2000, 2.0, 0.70),
        "slow": (5500, 1.4, 0.70),
        "v2": (2000, 2.0, 0.66),
        "v3": (2400, 2.1, 0.68),
        "lower": (1800, 2.0, 0.62),
        "v5": (2200, 1.9, 0.69),
        "v6": (2000, 2.0, 0.71),
    }
    df = campaign_runs(truth, seeds=2, c_max=budget, n_points=41, drift_sd=0.006, seed_sd=0.006, seed=4)
    cfit = _fit(df, fit_upto=dict.fromkeys(truth, budget / 2))
    fcs = forecast_campaign(cfit, target=dict.fromkeys(truth, budget), n_resamples=200)
    slow = fcs["slow"]
    assert not slow.verdict.predictable and cfit.fits["slow"].B > cfit.fits["slow"].unpooled.B + 0.1
    call = call_difference(slow, fcs["baseline"], budget)
    assert call.label == "cannot tell yet", call
    assert "own fit does not back it" in call.reason and "the joint fit says worse" in call.reason, call.reason
    assert call.text(DEFAULT_MARGIN).startswith("cannot tell yet: the variant's own fit"), call.text(DEFAULT_MARGIN)
    lower = call_difference(fcs["lower"], fcs["baseline"], budget)
    assert lower.label == "worse" and lower.hi < -DEFAULT_MARGIN, lower


@pytest.mark.parametrize("study", ["loo-gpu3", "loo-gpu4"])
def test_recorded_half_budget_calls_hold_a_slower_variant_back_and_keep_a_clear_gain(study):
    """On the recorded GPU studies, from half the budget: lr_half (slower, not lower; at the budget
    within 0.006–0.019 of the baseline) is not called worse (loo-gpu3's joint fit called it worse by
    0.08), and length=penalty (+0.19 to +0.23 at the budget) is still called better, though its
    own fit's A interval reaches the grid's top (a higher ceiling only widens a gain)."""
    from pathlib import Path

    from analysis.loo import campaign_model

    curves = pd.read_csv(Path(__file__).resolve().parents[1] / "results" / study / "curves.csv")
    half = campaign_model(curves, fit_settings(None), 300, fraction=0.5)
    base = half.forecasts["baseline"]

    def call(v: str):
        return call_difference(half.forecasts[v], base, min(half.budgets[v], half.budgets["baseline"]))

    assert call("control=lr_half").label == "cannot tell yet", call("control=lr_half")
    assert call("length=penalty").label == "better", call("length=penalty")

"""Honest predictions: the two bands, backtests and the predictability verdict on planted cases."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from scalefit import FitError, bootstrap, fit_sigmoid, forecast, sigmoid
from scalefit.data.synthetic import TABLE1, realistic_runs, synthetic_curve
from scalefit.forecasts.single import eval_sd

A_GRID = np.round(np.arange(0.05, 1.0, 0.005), 3)


def _fit(df, fit_upto=None, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit_sigmoid(df["compute"], df["value"], runs=df["seed"], fit_upto=fit_upto, a_grid=A_GRID, **kw)


def test_a_curve_stopped_before_its_knee_is_not_yet_predictable():
    cm, b, a = TABLE1["ScaleRL"]
    df = realistic_runs(cm, b, a, c_max=cm * 0.8, n_points=41, seed=1)  # ends before C_mid
    fc = forecast(_fit(df), n_resamples=200)
    assert not fc.verdict.predictable
    # the fit may believe in a knee it has not reached (A low, B steep): the backtests see through it
    assert any(r.startswith(("knee not reached", "backtest error")) for r in fc.verdict.reasons)
    assert "not yet predictable" in fc.verdict.text()


def test_knee_share_and_more_compute_are_reported():
    c, v = synthetic_curve(2542, 1.92, 0.61, c_max=2000.0, n_points=41, n_prompts=None)  # exact, before C_mid
    fc = forecast(fit_sigmoid(c, v, a_grid=A_GRID), n_resamples=100)
    knee = [r for r in fc.verdict.reasons if r.startswith("knee not reached")]
    assert knee and "% of the fitted gain" in knee[0]
    assert fc.verdict.more_compute == pytest.approx(2542 / 2000.0, rel=0.05)


def test_a_long_clean_curve_is_predictable_and_its_band_holds_the_truth():
    cm, b, a = TABLE1["ScaleRL"]
    df = realistic_runs(cm, b, a, c_max=cm * 12, n_points=81, n_prompts=2000, drift_sd=0.0, seed_sd=0.0, seed=2)
    f = _fit(df, fit_upto=cm * 6)
    fc = forecast(f, eval_prompts=2000, n_resamples=400)
    assert fc.verdict.predictable, fc.verdict.text()
    assert fc.expected_error is not None and fc.expected_error <= 0.02
    target = cm * 12
    truth = sigmoid(target, a, b, cm, 0.30)
    clo, chi = fc.confidence_band([target])
    plo, phi = fc.prediction_band([target])
    assert clo[0] <= truth <= chi[0]
    assert plo[0] < clo[0] and chi[0] < phi[0]  # an evaluation is less certain than the mean curve


def test_grid_edge_makes_a_fit_not_yet_predictable():
    c, v = synthetic_curve(2542, 1.92, 0.90, c_max=16_000.0, n_prompts=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = fit_sigmoid(c, v)  # default grid tops out at 0.800
    fc = forecast(f, n_resamples=100)
    assert not fc.verdict.predictable and any("edge of its grid" in r for r in fc.verdict.reasons)


def test_too_few_points_to_backtest_is_said():
    c, v = synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0, n_points=7, seed=0)
    fc = forecast(fit_sigmoid(c, v, a_grid=A_GRID), n_resamples=100)
    assert not fc.verdict.predictable and any(r.startswith("too few points to backtest") for r in fc.verdict.reasons)


def test_backtests_use_only_fitted_points_at_the_questions_ratio():
    cm, b, a = TABLE1["ScaleRL-8gen"]
    df = realistic_runs(cm, b, a, c_max=cm * 10, n_points=41, seed=3)
    f = _fit(df, fit_upto=cm * 5)
    fc = forecast(f, n_resamples=100)  # target = the last held-out point: ratio 2
    assert fc.ratio == pytest.approx(2.0)
    assert 2 <= len(fc.backtests) <= 6
    for bt in fc.backtests:
        assert (
            bt.target <= f.compute.max()
            and np.sqrt(2.0) * bt.origin <= bt.target * (1 + 1e-9)
            and bt.target <= 2 * bt.origin * (1 + 1e-9)
        )


def test_evaluation_size_floors_the_noise():
    c, v = synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0, n_prompts=None)  # no noise at all
    f = fit_sigmoid(c, v, a_grid=A_GRID)
    quiet = forecast(f, n_resamples=100, backtest=False)
    known = forecast(f, n_resamples=100, eval_prompts=100, backtest=False)
    floor = float(np.sqrt(np.mean(eval_sd(f.predict(f.compute), 100) ** 2)))
    assert quiet.noise.sigma < 1e-6 and known.noise.sigma >= floor
    lo, hi = known.prediction_band([16_000.0])
    assert hi[0] - lo[0] > 2 * 1.6 * floor * 0.9


def test_prediction_band_covers_drifting_runs_where_the_iid_bootstrap_does_not():
    """The bug this replaces: an iid point bootstrap of the mean curve, read as where observations land."""
    cm, b, a = TABLE1["ScaleRL"]
    hit = hit_iid = 0
    n = 24
    for i in range(n):
        df = realistic_runs(cm, b, a, c_max=cm * 8, n_points=41, drift_sd=0.012, drift_phi=0.85, seed=100 + i)
        f = _fit(df, fit_upto=cm * 4)
        final = df["compute"].max()
        observed = float(df["value"].iloc[-1])
        lo, hi = forecast(f, n_resamples=200, target=final).prediction_band([final])
        hit += lo[0] <= observed <= hi[0]
        ilo, ihi = bootstrap(
            fit_sigmoid(df["compute"], df["value"], fit_upto=cm * 4, a_grid=A_GRID), 200, level=0.9
        ).predict_interval([final])
        hit_iid += ilo[0] <= observed <= ihi[0]
    assert hit / n >= 0.75  # nominal 90%
    assert hit_iid / n < hit / n


def test_several_seeds_are_separate_series():
    cm, b, a = TABLE1["ScaleRL"]
    df = realistic_runs(cm, b, a, c_max=cm * 8, n_points=21, seeds=3, seed_sd=0.01, seed=5)
    fc = forecast(_fit(df), n_resamples=100, backtest=False)
    assert fc.noise.n_runs == 3
    lo1, hi1 = fc.prediction_band([cm * 8], n_runs=1)
    lo3, hi3 = fc.prediction_band([cm * 8], n_runs=3)
    assert hi3[0] - lo3[0] < hi1[0] - lo1[0]  # the mean of three runs is less uncertain than one


@pytest.mark.parametrize(
    "kw,msg", [({"level": 1.5}, "level"), ({"n_resamples": 5}, "n_resamples"), ({"eval_prompts": 0}, "eval_prompts")]
)
def test_bad_forecast_arguments_are_refused(kw, msg):
    c, v = synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0)
    with pytest.raises(FitError, match=msg):
        forecast(fit_sigmoid(c, v, a_grid=A_GRID), **kw)


def test_a_step_fit_with_b_on_its_bound_is_flagged_and_decides_nothing():
    """A curve that is flat within noise and jumps at its end (the default CPU campaign's baseline
    at 30 steps: 0.380 0.363 0.398 0.362 0.361 0.399 0.414) fits best as a step, B on its bound:
    the fit says so, the forecast is not predictable for that reason, and a comparison cannot decide."""
    from scalefit import compare_fits

    c = np.arange(1, 7) * 640.0
    v = np.array([0.363, 0.398, 0.362, 0.361, 0.399, 0.414])
    with pytest.warns(UserWarning, match="B = 50 is at a bound"):
        step = fit_sigmoid(c, v, r0=0.380, a_grid=A_GRID)
    assert step.b_at_bound and any("not a sigmoid" in w for w in step.warnings)
    assert step.to_dict()["b_at_bound"] is True  # `python -m scalefit fit --json` carries it too
    fc = forecast(step, n_resamples=100)
    assert not fc.verdict.predictable and any("on a bound of its range: a step" in r for r in fc.verdict.reasons)

    cs, vs = synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0, seed=0)
    smooth = fit_sigmoid(cs, vs, a_grid=A_GRID)
    assert not smooth.b_at_bound and not smooth.warnings  # a real sigmoid is not flagged
    cmp = compare_fits(smooth, step, names=("base", "variant"))
    assert cmp.verdict.startswith("cannot decide") and "variant's B = 50 is on a bound of its range" in cmp.verdict
    # with forecasts the verdict says why once, not again inside "not yet predictable (...)"
    cmp = compare_fits(smooth, step, names=("base", "variant"), forecasts=(forecast(smooth, n_resamples=100), fc))
    assert cmp.verdict.count("on a bound of its range") == 1, cmp.verdict
    assert "variant is not yet predictable (too few points" in cmp.verdict

"""The forecast interface (``scalefit.forecasts.interface.Forecast``): a variant fitted alone and a variant of
a campaign's joint fit answer every member the base declares, with the same kind of answer, and a
caller given either never needs to ask which it holds. Settings travel as one ``FitSettings``."""

from __future__ import annotations

import ast
import inspect
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from runners.campaign.spec import fit_settings
from scalefit import compare_fits, decide_stop
from scalefit.data.synthetic import campaign_runs
from scalefit.forecasts.interface import Backtest, Call, CampaignForecast, Forecast, Verdict, call_difference
from scalefit.forecasts.pooled import PooledForecast, forecast_variants
from scalefit.forecasts.single import SingleForecast

ROOT = Path(__file__).resolve().parents[1]
TRUTH = {"baseline": (3000, 1.9, 0.70), "lower": (3000, 1.9, 0.60), "slower": (6000, 1.9, 0.70)}
BUDGET = 30_000.0


@pytest.fixture(scope="module")
def both() -> dict[str, CampaignForecast]:
    """One synthetic campaign fitted on its first half, jointly and one variant at a time."""
    df = campaign_runs(TRUTH, seeds=2, c_max=BUDGET, n_points=31, drift_sd=0.004, seed_sd=0.004, seed=5)
    data = {v: (g["compute"].to_numpy(), g["value"].to_numpy(), g["seed"].to_numpy()) for v, g in df.groupby("variant")}
    settings = fit_settings({"a_grid": "0.30:0.95:0.005", "eval_prompts": 1000})
    upto, target = dict.fromkeys(TRUTH, BUDGET / 2), dict.fromkeys(TRUTH, BUDGET)
    return {
        pooling: forecast_variants(
            data, replace(settings, pooling=pooling), fit_upto=upto, target=target, n_resamples=60
        )
        for pooling in ("partial", "none")
    }


def test_each_model_implements_every_member_the_base_declares():
    assert inspect.isabstract(Forecast)
    for cls in (SingleForecast, PooledForecast):
        assert not inspect.isabstract(cls), (cls, cls.__abstractmethods__)
        assert isinstance(cls.max_backtests, int) and isinstance(cls.backtest_resamples, int), cls
    # what differs between the two is declared on each class, once (issue 43: MAX_BACKTESTS 6 vs 3)
    assert (SingleForecast.max_backtests, PooledForecast.max_backtests) == (6, 3)
    assert (SingleForecast.backtest_resamples, PooledForecast.backtest_resamples) == (150, 120)
    assert not SingleForecast.paired and PooledForecast.paired


def _answers(fc: Forecast) -> dict[str, type | tuple]:
    """The kind of every answer the interface declares."""
    lo, hi = fc.confidence_band([BUDGET])
    plo, phi = fc.prediction_band([BUDGET], n_runs=2)
    t = fc.target_band([BUDGET], 2)
    err = fc.expected_error
    assert fc.mean_draws([BUDGET]).shape == (len(fc.samples), 1)
    assert fc.target_draws([BUDGET], 2).ndim == 1
    assert all(np.isfinite(x).all() for x in (lo, hi, plo, phi, t)), fc
    return {
        "interval": tuple(type(x) for x in fc.interval("A")),
        "bands": (type(lo), type(plo), type(t[0])),
        "expected_error": type(err) if err is None else float,
        "expected_error_at": type(fc.expected_error_at([BUDGET], 2)),
        "verdict": type(fc.verdict),
        "backtests": tuple({type(b) for b in fc.backtests}),
        "own": isinstance(fc.own(), Forecast),
        "mean_windows": type(fc.mean_windows),
        "no_band": type(fc.no_band),
    }


def test_either_forecast_gives_the_same_kind_of_answer_to_every_member(both):
    joint, alone = both["partial"].forecasts["baseline"], both["none"].forecasts["baseline"]
    assert isinstance(joint, PooledForecast) and isinstance(alone, SingleForecast)
    a, b = _answers(joint), _answers(alone)
    for key in a:
        assert a[key] == b[key], (key, a[key], b[key])
    assert a["verdict"] is Verdict and a["backtests"] == (Backtest,)
    # half a campaign of 31 points leaves each forecast its full share of origins to backtest
    assert (len(joint.backtests), len(alone.backtests)) == (PooledForecast.max_backtests, SingleForecast.max_backtests)
    assert not alone.verdict.band_only  # declared on every verdict; only a paired model sets it


def test_callers_read_either_forecast_without_asking_which(both):
    for pooling, res in both.items():
        fcs = res.forecasts
        assert set(res.fits) == set(TRUTH) and not res.failed, (pooling, res.failed)
        # "lower" is the baseline with a ceiling 0.10 lower (TRUTH): each caller gives that known answer
        call = call_difference(fcs["lower"], fcs["baseline"], BUDGET)
        assert isinstance(call, Call) and call.label == "worse", (pooling, call)
        assert -0.12 < call.lo <= call.delta <= call.hi < -0.08, (pooling, call)
        d = decide_stop(fcs["lower"], fcs["baseline"], BUDGET, BUDGET)
        assert d.stop and d.probability is not None and d.probability < 0.05, (pooling, d)
        assert d.variant_final == pytest.approx(0.60, abs=0.01) and d.baseline_final == pytest.approx(0.70, abs=0.01)
        c = compare_fits(res.fits["baseline"], res.fits["lower"], forecasts=(fcs["baseline"], fcs["lower"]))
        assert c.winner == "baseline" and c.A_baseline - c.A_candidate == pytest.approx(0.10, abs=0.015), (pooling, c)


def test_the_margin_of_the_settings_reaches_every_verdict():
    """``fit.margin`` goes down in the one settings object: a margin nothing meets is in every
    verdict's reasons, where the margin the campaign was fitted with was not."""
    df = campaign_runs(TRUTH, seeds=2, c_max=BUDGET, n_points=31, drift_sd=0.004, seed_sd=0.004, seed=5)
    data = {v: (g["compute"].to_numpy(), g["value"].to_numpy(), g["seed"].to_numpy()) for v, g in df.groupby("variant")}
    settings = fit_settings({"a_grid": "0.30:0.95:0.005", "eval_prompts": 1000, "margin": 1e-4})
    for pooling in ("partial", "none"):
        res = forecast_variants(data, replace(settings, pooling=pooling), n_resamples=60)
        for v, fc in res.forecasts.items():
            assert fc.margin == 1e-4, (pooling, v)
            assert not fc.verdict.predictable and any("0.0001" in r for r in fc.verdict.reasons), (pooling, v)


def _private_imports(path: Path) -> list[str]:
    """``from scalefit.x import _name`` (a private name of another module) in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("scalefit", "analysis"):
            out += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return out


def test_no_module_imports_a_private_name_of_another():
    found = [
        hit for d in ("scalefit", "analysis") for p in sorted((ROOT / d).glob("*.py")) for hit in _private_imports(p)
    ]
    assert not found, found


def test_a_variant_the_fit_leaves_out_stays_out_of_the_backtests():
    """loo-gpu5's off_policy=ppo at half its compute: flat there, so no fit, while a backtest's refit
    of the campaign (which sets ``fit_upto`` for the fitted variants only) fits all of its points;
    the backtests skip it instead of failing on it."""
    df = campaign_runs(TRUTH, seeds=2, c_max=BUDGET, n_points=31, drift_sd=0.004, seed_sd=0.004, seed=5)
    data = {v: (g["compute"].to_numpy(), g["value"].to_numpy(), g["seed"].to_numpy()) for v, g in df.groupby("variant")}
    c, y, runs = data["slower"]
    data["late"] = (c, np.where(c < 0.55 * BUDGET, float(y[c == 0].mean()), y), runs)  # flat, then rises
    settings = fit_settings({"a_grid": "0.30:0.95:0.005", "eval_prompts": 1000})
    upto = dict.fromkeys(data, BUDGET / 2)
    res = forecast_variants(data, settings, fit_upto=upto, target=dict.fromkeys(data, BUDGET), n_resamples=30)
    assert "late" in res.failed and set(res.forecasts) == set(TRUTH), res.failed
    assert res.forecasts["baseline"].campaign_backtests > 0

"""Stop a variant early: is its final value at the full budget still likely to reach the
baseline's (minus the comparison margin), given what both curves show so far?

The probability comes from the two forecasts' calibrated draws of the mean curve at each one's
budget (independent bootstraps, paired at random). A variant is stopped when both fits are
predictable and that probability is below the risk level, or when a fit is identified but its
backtest error (a joint model's forecast: the expected error of its k-seed prediction) exceeds the
margin and the probability stays below the risk level even with each prediction moved towards the
other by that error (z(risk) times it): a gap far larger
than the error of the forecasts decides what the margin alone cannot. A forecast with no band (a
joint model's curve that is not a sigmoid: ``Forecast.no_band``) never stops anything: its
draws are undefined, and the reason says why. Anything less certain keeps running, with the reason
stated. Numbers only: which runs to stop and how is the caller's business.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.special import ndtri  # the normal quantile (scipy.stats.norm.ppf), without scipy.stats

from scalefit.defaults import DEFAULT_MARGIN
from scalefit.forecasts.interface import Forecast
from scalefit.forecasts.uncertainty import central_percentiles


@dataclass
class StopDecision:
    stop: bool
    reason: str
    probability: float | None = None  # P(variant's final >= baseline's final - margin)
    probability_A: float | None = None  # the same for the asymptotes
    variant_final: float | None = None  # predicted mean value at the variant's budget
    variant_band: tuple[float, float] | None = None
    baseline_final: float | None = None
    baseline_band: tuple[float, float] | None = None
    fit_model: str | None = None  # which fit decided: the joint model's description, or the per-variant fit's

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def error_name(*forecasts: Forecast) -> str:
    """What the error a prediction is moved by is, in the forecasts' own words (``Forecast.error_name``):
    a single fit's backtest error, or the joint model's expected error of its k-seed prediction."""
    return " / ".join(sorted({fc.error_name for fc in forecasts}))


def decide_stop(
    variant: Forecast,
    baseline: Forecast,
    variant_budget: float,
    baseline_budget: float,
    *,
    margin: float = DEFAULT_MARGIN,
    risk: float = 0.05,
    seed: int = 0,
) -> StopDecision:
    """Stop when P(variant's final >= baseline's final - margin) < risk and both fits are predictable."""
    if not 0.0 < risk < 0.5:
        raise ValueError(f"risk must lie in (0, 0.5), e.g. 0.05; got {risk}")
    no_band = _no_band_decision(variant, baseline, variant_budget, baseline_budget)
    if no_band is not None:
        return no_band
    v, b, a_v, a_b = _paired_draws(variant, baseline, variant_budget, baseline_budget, seed)
    q = central_percentiles(1.0 - 2.0 * risk)
    out = StopDecision(
        stop=False,
        reason="",
        probability=float(np.mean(v >= b - margin)),
        probability_A=float(np.mean(a_v >= a_b - margin)),
        variant_final=float(variant.point([variant_budget])[0]),
        variant_band=tuple(float(x) for x in np.percentile(v, q)),
        baseline_final=float(baseline.point([baseline_budget])[0]),
        baseline_band=tuple(float(x) for x in np.percentile(b, q)),
    )
    unsure = [
        f"{who} not yet predictable ({'; '.join(fc.verdict.reasons)})"
        for who, fc in (("variant", variant), ("baseline", baseline))
        if fc.verdict is None or not fc.verdict.predictable
    ]
    if unsure and _robust_stop(out, variant, baseline, v, b, margin, risk, variant_budget):
        return out
    _plain_call(out, unsure, margin, risk)
    return out


def _no_band_decision(
    variant: Forecast, baseline: Forecast, variant_budget: float, baseline_budget: float
) -> StopDecision | None:
    """Keep running where either curve gets no band (not a sigmoid: its draws are undefined, and no
    probability can rule the variant out); None where both have one."""
    no_band = [
        f"the {who}'s curve gets no band ({'; '.join(fc.no_band)})"
        for who, fc in (("variant", variant), ("baseline", baseline))
        if fc.no_band
    ]
    if not no_band:
        return None
    return StopDecision(
        False,
        "keep running: " + "; ".join(no_band) + ": not a sigmoid, so the fit cannot rule the variant out",
        variant_final=float(variant.point([variant_budget])[0]),
        baseline_final=float(baseline.point([baseline_budget])[0]),
    )


def _paired_draws(
    variant: Forecast, baseline: Forecast, variant_budget: float, baseline_budget: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Equal numbers of the two forecasts' draws of the final value and of A, shuffled (``seed``) so
    the i-th of one meets a random draw of the other."""
    v = variant.mean_draws([variant_budget])[:, 0]
    b = baseline.mean_draws([baseline_budget])[:, 0]
    rng = np.random.default_rng(seed)
    n = min(len(v), len(b))
    v, b = rng.permutation(v)[:n], rng.permutation(b)[:n]
    a_v = rng.permutation(variant.samples[:, 0])[:n]
    a_b = rng.permutation(baseline.samples[:, 0])[:n]
    return v, b, a_v, a_b


def _robust_stop(
    out: StopDecision,
    variant: Forecast,
    baseline: Forecast,
    v: np.ndarray,
    b: np.ndarray,
    margin: float,
    risk: float,
    budget: float,
) -> bool:
    """Where a fit is not yet predictable only by its band (``Verdict.error_only``), stop (setting
    ``out``) if the variant is ruled out even with both predictions moved towards each other by their
    expected errors, the variant's also up by how far its open ceiling lets it rise at ``budget``."""
    if not all(
        fc.verdict is not None and (fc.verdict.predictable or fc.verdict.error_only) for fc in (variant, baseline)
    ):
        return False
    z = float(ndtri(1.0 - risk))
    # a band-only verdict's expected error is its own draws' spread, already in v and b: not moved twice
    e_v, e_b = (
        z * (fc.expected_error or 0.0) if not (fc.verdict.predictable or fc.verdict.band_only) else 0.0
        for fc in (variant, baseline)
    )
    e_v += float(variant.open_rise([budget])[0])  # a variant still steepening may rise as its open ceiling lets it
    robust = float(np.mean(v + e_v >= b - e_b - margin))
    if robust >= risk:
        return False
    out.stop = True
    out.reason = (
        f"stop: P(final >= baseline - {margin:g}) = {robust:.3f} < risk {risk:g} even with the predictions "
        f"moved towards each other by their {error_name(variant, baseline)}s (+{e_v:.3f}, -{e_b:.3f}) "
        f"(predicted {out.variant_final:.3f} vs baseline {out.baseline_final:.3f})"
    )
    return True


def _plain_call(out: StopDecision, unsure: list[str], margin: float, risk: float) -> None:
    """Set ``out``'s call: keep running while a fit is unsure, else stop where P < risk."""
    if unsure:
        out.reason = "keep running: " + "; ".join(unsure)
    elif out.probability < risk:
        out.stop = True
        out.reason = (
            f"stop: P(final >= baseline - {margin:g}) = {out.probability:.3f} < risk {risk:g} "
            f"(predicted {out.variant_final:.3f} vs baseline {out.baseline_final:.3f})"
        )
    else:
        out.reason = f"keep running: P(final >= baseline - {margin:g}) = {out.probability:.3f} >= risk {risk:g}"

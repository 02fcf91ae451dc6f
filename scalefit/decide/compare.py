"""Compare two recipes with the paper's rule (§2.1), and refuse to when a fit cannot say.

If the asymptotes lie within the margin (default ±0.02, the run-to-run spread of A),
both curves are refitted with their mean A and compared on B (compute efficiency);
otherwise the higher A wins. A fit whose A or C_mid sits on its grid's edge has no
identified optimum, and a fit whose forecast is "not yet predictable" cannot be trusted
beyond its data: either gives the verdict ``undecided`` with the reason, never a winner.
With forecasts, the difference in A must also clear the bootstrap noise of both fits.

The rule reads each model's declaration (``CurveFit.parameters``), never its parameter names: A
is the declared ceiling, B the first declared efficiency parameter (higher: more compute-efficient),
and the refit at the shared ceiling holds it fixed (``CurveFit.refit_fixed``). A model without a
ceiling the data identify (``CurveFit.has_asymptote`` False: the power law) has none to compare:
the two fits' predicted values at the budget are compared with the same margin (rule ``value``),
and the verdict says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from scalefit.defaults import DEFAULT_MARGIN
from scalefit.forecasts.interface import Forecast
from scalefit.forecasts.uncertainty import interval_holding
from scalefit.models.base import CurveFit


@dataclass
class Comparison:
    baseline: str
    candidate: str
    A_baseline: float
    A_candidate: float
    rule: str  # "A" (asymptotes differ), "B" (same asymptote, compare efficiency) or "undecided"
    winner: str  # baseline, candidate, tie or undecided
    B_baseline: float
    B_candidate: float
    shared_A: float | None
    verdict: str
    delta_A_interval: tuple[float, float] | None = None
    budget: float | None = None  # rule "value": the compute the predicted values are compared at
    value_baseline: float | None = None
    value_candidate: float | None = None
    delta_value_interval: tuple[float, float] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _unfit_reasons(name: str, f: CurveFit, fc: Forecast | None) -> list[str]:
    said = f.not_identified
    out = [f"{name}'s {reason}" for reason in said]
    ceiling = fc.open_ceiling if fc is not None and f.has_asymptote else None  # None: its data show the knee
    if ceiling is not None:  # A from a curve still steepening is the sigmoid's guess
        out.append(f"{name}'s ceiling is not told by its data ({ceiling.why})")
    # a verdict whose only doubt is the spread of a few seeds' mean, in a model whose draws are paired
    # (band_only), leaves the comparison to the paired interval of ΔA below; any other doubt stops it
    doubt = fc is not None and fc.verdict is not None and not fc.verdict.predictable
    if doubt and not fc.verdict.band_only:
        rest = [r for r in fc.verdict.reasons if r not in said]  # the forecast repeats what is said above
        if rest or not out:
            out.append(f"{name} is not yet predictable" + (f" ({'; '.join(rest)})" if rest else ""))
    return out


def compare_fits(
    baseline: CurveFit,
    candidate: CurveFit,
    *,
    margin: float = DEFAULT_MARGIN,
    names: tuple[str, str] = ("baseline", "candidate"),
    b_tolerance: float = 1e-3,
    forecasts: tuple[Forecast, Forecast] | None = None,
    budget: float | None = None,
) -> Comparison:
    """Apply the paper's rule and return the verdict with its numbers (``undecided`` with the
    reason when either fit cannot support one). ``budget``: where fits without an asymptote are
    compared (default the largest compute either curve has)."""
    nb, nc = names
    (a1, b1), (a2, b2) = _ceiling_and_efficiency(baseline), _ceiling_and_efficiency(candidate)
    fb, fcand = forecasts if forecasts is not None else (None, None)
    why = _unfit_reasons(nb, baseline, fb) + _unfit_reasons(nc, candidate, fcand)
    if why:
        verdict = "cannot decide: " + "; ".join(why)
        return Comparison(nb, nc, a1, a2, "undecided", "undecided", b1, b2, None, verdict)
    if not (baseline.has_asymptote and candidate.has_asymptote):
        return _compare_at_budget(baseline, candidate, margin, names, forecasts, budget)
    delta = None
    ceiling, efficiency = baseline.parameters.ceiling, baseline.parameters.efficiency[0]
    if fb is not None and fcand is not None:
        k = min(len(fb.samples), len(fcand.samples))
        i, j = baseline.sample_names.index(ceiling), candidate.sample_names.index(candidate.parameters.ceiling)
        delta = interval_holding(fcand.samples[:k, j] - fb.samples[:k, i], a2 - a1, fb.level)
    if abs(a1 - a2) > margin:
        winner = nb if a1 > a2 else nc
        verdict = (
            f"{winner} has the higher asymptote: A {a1:.3f} ({nb}) vs {a2:.3f} ({nc}), "
            f"|ΔA| = {abs(a1 - a2):.3f} > {margin}"
        )
        if delta is not None and delta[0] <= 0.0 <= delta[1]:
            verdict += f", but ΔA's {fb.level:.0%} interval [{delta[0]:+.3f}, {delta[1]:+.3f}] holds 0: not significant"
            winner = "tie"
        return Comparison(nb, nc, a1, a2, "A", winner, b1, b2, None, verdict, delta)
    shared = float(np.mean([a1, a2]))
    f1, f2 = baseline.refit_fixed(ceiling, shared), candidate.refit_fixed(candidate.parameters.ceiling, shared)
    e1, e2 = f1.params[efficiency], f2.params[candidate.parameters.efficiency[0]]
    if abs(e1 - e2) <= b_tolerance:
        winner, how = "tie", "equally compute-efficient"
    else:
        winner = nb if e1 > e2 else nc
        how = f"{winner} is more compute-efficient"
    verdict = (
        f"same asymptote within ±{margin} ({ceiling} {a1:.3f} vs {a2:.3f}); "
        f"refitted at shared {ceiling} = {shared:.4f}: "
        f"{efficiency} {e1:.2f} ({nb}) vs {e2:.2f} ({nc}) → {how}"
    )
    return Comparison(nb, nc, a1, a2, "B", winner, e1, e2, shared, verdict, delta)


def _ceiling_and_efficiency(f: CurveFit) -> tuple[float, float]:
    """The fit's ceiling (else its asymptote) and its compared efficiency parameter (NaN: none)."""
    declared, params = f.parameters, f.params
    top, eff = declared.asymptote, declared.efficiency
    return params.get(top, np.nan) if top else np.nan, params.get(eff[0], np.nan) if eff else np.nan


def _compare_at_budget(
    baseline: CurveFit,
    candidate: CurveFit,
    margin: float,
    names: tuple[str, str],
    forecasts: tuple[Forecast, Forecast] | None,
    budget: float | None,
) -> Comparison:
    """Rule ``value``: the predicted values at the budget, the higher wins when they differ by more
    than the margin (and, with forecasts, the interval of the paired difference excludes 0)."""
    nb, nc = names
    if budget is None:
        budget = float(max(baseline.inputs[0].max(), candidate.inputs[0].max()))
    v1, v2 = (float(f.predict(np.array([budget]))[0]) for f in (baseline, candidate))
    (a1, b1), (a2, b2) = _ceiling_and_efficiency(baseline), _ceiling_and_efficiency(candidate)
    delta = None
    if forecasts is not None:
        fb, fc = forecasts
        d_b, d_c = fb.mean_draws([budget])[:, 0], fc.mean_draws([budget])[:, 0]
        k = min(len(d_b), len(d_c))
        delta = interval_holding(d_c[:k] - d_b[:k], v2 - v1, fb.level)
    how = f"no asymptote to compare ({baseline.name.replace('_', ' ')}): predicted values at the budget {budget:.4g}"
    if abs(v1 - v2) > margin:
        winner = nb if v1 > v2 else nc
        verdict = f"{how}: {v1:.3f} ({nb}) vs {v2:.3f} ({nc}), |Δ| = {abs(v1 - v2):.3f} > {margin} → {winner} is higher"
        if delta is not None and delta[0] <= 0.0 <= delta[1]:
            level = f"{forecasts[0].level:.0%}"
            verdict += f", but Δ's {level} interval [{delta[0]:+.3f}, {delta[1]:+.3f}] holds 0: not significant"
            winner = "tie"
    else:
        winner = "tie"
        verdict = f"{how}: {v1:.3f} ({nb}) vs {v2:.3f} ({nc}), the same within ±{margin}"
    return Comparison(nb, nc, a1, a2, "value", winner, b1, b2, None, verdict, None, budget, v1, v2, delta)

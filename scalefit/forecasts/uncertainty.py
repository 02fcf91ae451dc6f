"""Uncertainty of the sigmoid: bootstrap over points, and the spread of A across seeds (paper's ±0.02).

Both are the sigmoid's own diagnostics (its A, B, C_mid); ``scalefit.forecasts.single`` gives bands for any
curve model."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from scalefit.defaults import DEFAULT_MARGIN
from scalefit.errors import FitError
from scalefit.models.base import CurveFit
from scalefit.models.curve import sigmoid, sigmoid_residuals
from scalefit.models.lm import batched_lm
from scalefit.models.registry import make_model
from scalefit.models.sigmoid import B_BOUNDS, SigmoidFit

PARAMS = ("A", "B", "C_mid")


def central_percentiles(level: float) -> tuple[float, float]:
    """The percentiles bounding the central ``level`` share of a sample (0.9 → 5, 95)."""
    tail = (1.0 - level) / 2.0 * 100.0
    return tail, 100.0 - tail


def interval_holding(draws: np.ndarray, point: float, level: float) -> tuple[float, float]:
    """The central ``level`` interval of ``draws``, widened to reach ``point`` where they centre
    elsewhere. A joint campaign fit's resamples refit curves already drawn towards the campaign's B
    with that prior again (the pull applied twice), so they can centre off the fit shown
    (loo-cpu: ``ΔA -0.050, 90% interval [-0.048, +0.014]``). Widening, not shifting: shifted, their
    spread (narrowed by the same prior) made ΔB's interval exclude 0 for 10 of 48 synthetic variants
    whose true B equals the baseline's; an interval only ever widens, so no call is made on it that
    the resamples alone would not make."""
    lo, hi = np.percentile(draws, central_percentiles(level))
    return float(min(lo, point)), float(max(hi, point))


@dataclass
class Bootstrap:
    """Parameter samples from refitting resampled points; percentile intervals."""

    fit: SigmoidFit
    samples: np.ndarray  # (n_resamples, 3): A, B, C_mid
    level: float = 0.95

    def interval(self, param: str) -> tuple[float, float]:
        lo, hi = np.percentile(self.samples[:, PARAMS.index(param)], central_percentiles(self.level))
        return float(lo), float(hi)

    def predict_interval(self, compute) -> tuple[np.ndarray, np.ndarray]:
        """Pointwise interval of the predicted pass rate at each compute value."""
        c = np.atleast_1d(np.asarray(compute, float))
        A, B, Cm = (self.samples[:, i : i + 1] for i in range(3))
        curves = sigmoid(c[None, :], A, B, Cm, self.fit.R0)
        lo, hi = np.percentile(curves, central_percentiles(self.level), axis=0)
        return lo, hi

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"level": self.level, "n_resamples": len(self.samples)}
        for p in PARAMS:
            out[f"{p}_interval"] = list(self.interval(p))
        return out


def bootstrap(fit: SigmoidFit, n_resamples: int = 1000, seed: int = 0, level: float = 0.95) -> Bootstrap:
    """Resample the fitted points with replacement and refit A, B and C_mid on each resample.

    All resamples are refitted at once (batched Levenberg–Marquardt in A, B, log C_mid,
    started from the full-data optimum), so 1,000 resamples take well under a second.
    A is continuous here, within [0, 1]; R0 stays fixed.
    """
    if not isinstance(fit, SigmoidFit):
        raise FitError(f"bootstrap() resamples a sigmoid fit's points, not a {fit.name}'s; forecast(fit) takes any")
    rng = np.random.default_rng(seed)
    n = fit.n_points
    idx = rng.integers(0, n, size=(n_resamples, n))
    log_x, y, r0 = np.log(fit.compute)[idx], fit.value[idx], fit.R0

    def residuals(theta: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return sigmoid_residuals(theta, log_x[rows], y[rows], r0)

    theta0 = np.tile([fit.A, fit.B, np.log(fit.C_mid)], (n_resamples, 1))
    c_lo, c_hi = np.log(fit.cmid_grid.min() / 10.0), np.log(fit.cmid_grid.max() * 10.0)
    lower = np.array([0.0, B_BOUNDS[0], c_lo])
    upper = np.array([1.0, B_BOUNDS[1], c_hi])
    theta, _ = batched_lm(residuals, theta0, lower, upper, iters=100)
    theta[:, 2] = np.exp(theta[:, 2])
    return Bootstrap(fit=fit, samples=theta, level=level)


@dataclass
class SeedSpread:
    """A fitted separately for each run (seed) of one recipe."""

    fits: dict[str, SigmoidFit]
    margin: float = DEFAULT_MARGIN

    @property
    def A_values(self) -> np.ndarray:
        """Each run's ceiling (the sigmoid's A)."""
        return np.array([_ceiling(f) for f in self.fits.values()])

    def to_dict(self) -> dict[str, Any]:
        a = self.A_values
        return {
            "A_by_run": {k: _ceiling(f) for k, f in self.fits.items()},
            "A_mean": float(a.mean()),
            "A_std": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
            "A_half_range": float((a.max() - a.min()) / 2.0),
            "margin": self.margin,
            "within_margin": bool((a.max() - a.min()) / 2.0 <= self.margin),
            "warnings": [f"{k}: {w}" for k, f in self.fits.items() for w in f.warnings],
        }


def _ceiling(f: CurveFit) -> float:
    return f.params[f.parameters.ceiling]


def seed_spread(
    curves: Mapping[str, tuple[Any, Any]], margin: float = DEFAULT_MARGIN, model: str = "sigmoid", **fit_kwargs: Any
) -> SeedSpread:
    """Fit each seed's curve on its own (``model``, a ``fit.model`` name with a ceiling, and its
    settings); the spread of its ceiling is the recipe's run-to-run noise.

    Grid-edge notes stay on each seed's fit (``SeedSpread.fits[name].warnings``, and ``to_dict``'s
    ``warnings``) instead of being raised once per seed."""
    est = make_model(model, **fit_kwargs)
    if est.parameters.ceiling is None:
        raise FitError(f"fit model {model!r} has no ceiling: no run-to-run spread of one")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fits = {name: est.clone().fit(c, v).result_ for name, (c, v) in curves.items()}
    return SeedSpread(fits, margin)

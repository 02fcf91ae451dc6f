"""Seeds as the unit of uncertainty: each run's deviation from its recipe's curve, pooled over a campaign.

Where a variant has several seeds, each seed's departure from the variant's mean at each
evaluation (scaled by sqrt(k / (k - 1))) is one draw of how a run wanders around its recipe's
curve — evaluation noise, drift and seed offset together, their correlation over the run kept
whole. A campaign's series form one pool (the assumption a t test pooling the seeds' variance
makes). Without several seeds anywhere, each run's residual series from its fitted curve stands in.
The pool draws whole series for a bootstrap and fits how the variance grows along the run.
An evaluation where one seed collapses below its siblings (``scalefit.data.unstable``: downward only,
on persistence or size) is left out of the pool (NaN in its series; its step's mean and deviations taken over
the other seeds), so one collapsed run cannot set the whole campaign's noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scalefit.data.unstable import flagged, typical_scale
from scalefit.errors import FitError
from scalefit.forecasts.single import run_series
from scalefit.models.sigmoid import SigmoidFit

P_GRID = np.linspace(0.0, 1.0, 401)
TREND_FROM = 0.25  # the variance line is fitted over the last three quarters of the fitted range


def _aligned(fit: SigmoidFit) -> tuple[np.ndarray, np.ndarray] | None:
    """The computes every run of the fit has, and each run's values there (runs x computes)."""
    c_all, v_all = fit.inputs
    series = run_series(fit)
    common = c_all[series[0]]
    for idx in series[1:]:
        common = np.intersect1d(common, c_all[idx])
    if len(common) < 4:
        return None
    rows = []
    for idx in series:
        c, v = c_all[idx], v_all[idx]
        rows.append(np.array([v[c == x].mean() for x in common]))
    return common, np.array(rows)


@dataclass
class DeviationPool:
    """Series of one run's deviation from its recipe's curve, on positions in its fitted range."""

    positions: list[np.ndarray]
    deviations: list[np.ndarray]
    kind: str  # "seeds": within-variant seed deviations; "residuals": runs' residuals from their fits
    dof: int

    def __post_init__(self) -> None:
        series = zip(self.positions, self.deviations, strict=True)  # a flagged (NaN) evaluation: interpolated
        self.on_grid = np.array([np.interp(P_GRID, p[np.isfinite(d)], d[np.isfinite(d)]) for p, d in series])

    def __len__(self) -> int:
        return len(self.deviations)

    def variance(self, window: int = 1) -> tuple[float, float]:
        """(a, b) of var(p) = a + b p: the variance of one run's mean over ``window`` successive
        evaluations ending at position p of the fitted range. A run wanders from its recipe's curve
        like a random walk (its variance grows with compute) on top of noise that does not grow
        (the evaluation's); both are fitted to the pool's squared deviations over the last three
        quarters of the fitted range (non-negative, weighted least squares: a run's start from the base model
        does not set its trend) and the line carries the noise beyond the fitted range."""
        ends, sq = [], []
        for p, d in zip(self.positions, self.deviations, strict=True):
            w = min(window, len(d))
            means = np.convolve(d, np.ones(w) / w, mode="valid")  # NaN where the window holds a flagged one
            ends.append(p[w - 1 :])
            sq.append(means**2)
        x, y = np.concatenate(ends), np.concatenate(sq)
        x, y = x[np.isfinite(y)], y[np.isfinite(y)]
        keep = x >= TREND_FROM - 1e-9  # the trend of the run as it is now, not its start from the base model
        if keep.sum() < 3:
            keep = x > 0
        x, y = x[keep], y[keep]
        if len(x) == 0:
            return 0.0, 0.0
        from scipy.optimize import nnls  # here: runners' commands that never fit start ~0.1 s sooner

        design = np.column_stack([np.ones_like(x), x])
        coef = np.array([float(np.mean(y)), 0.0])
        for _ in range(3):  # var(d^2) grows with its mean: reweight by the fitted variance
            w = 1.0 / np.maximum(design @ coef, 1e-12)
            coef, _ = nnls(design * w[:, None], y * w)
        return float(coef[0]), float(coef[1])

    def sd(self, window: int = 1, position: float = 1.0) -> float:
        a, b = self.variance(window)
        return float(np.sqrt(max(a + b * position, 0.0)))

    def phi(self) -> float:
        pairs = [(d[1:], d[:-1]) for d in self.deviations if len(d) > 1]
        pairs = [(a[ok], b[ok]) for a, b in pairs if (ok := np.isfinite(a) & np.isfinite(b)).any()]
        num = sum(float(a @ b) for a, b in pairs)
        den = sum(float(b @ b) for _, b in pairs)
        return float(np.clip(num / den, 0.0, 0.99)) if den > 0 else 0.0

    def draw(self, rng: np.random.Generator, positions: np.ndarray, size: int) -> np.ndarray:
        """``size`` deviation series at ``positions`` (size x len(positions)), donors drawn at random."""
        j = rng.integers(0, len(self), size=size)
        x = np.clip(positions, 0.0, 1.0) * (len(P_GRID) - 1)
        i0 = np.minimum(np.floor(x).astype(int), len(P_GRID) - 2)
        w = x - i0
        g = self.on_grid[j]
        return g[:, i0] * (1.0 - w) + g[:, i0 + 1] * w


def deviation_pool(fits: dict[str, SigmoidFit]) -> DeviationPool:
    """The campaign's seed deviations (variants with several seeds; flagged evaluations left out),
    else the runs' residuals."""
    pos, dev, dof = [], [], 0
    aligned = {v: _aligned(f) if len(np.unique(f.run_inputs)) > 1 else None for v, f in fits.items()}
    typical = typical_scale([al[1] for al in aligned.values() if al is not None])
    for v, f in fits.items():
        if aligned[v] is None:
            continue
        common, y = aligned[v]
        y = np.where(flagged(y, typical), np.nan, y)  # a collapse: out of the noise (not out of this fit)
        here = np.isfinite(y).sum(axis=0)  # seeds left at each step
        d = (y - np.nanmean(y, axis=0)) * np.sqrt(here / np.maximum(here - 1, 1))
        c_fit = float(f.compute.max())
        for row in d[np.isfinite(d).sum(axis=1) >= 2]:  # a run flagged nearly throughout has no series
            pos.append(common / c_fit)
            dev.append(row)
        dof += len(y) - 1
    if pos:
        return DeviationPool(pos, dev, "seeds", dof)
    for f in fits.values():
        c_all, v_all = f.inputs
        c_fit = float(f.compute.max())
        n = max(f.n_points, 5)
        for idx in run_series(f):
            pos.append(c_all[idx] / c_fit)
            dev.append((v_all[idx] - f.predict(c_all[idx])) * np.sqrt(n / (n - 3)))
            dof += 1
    if not pos:
        raise FitError("no runs to measure the noise from")
    return DeviationPool(pos, dev, "residuals", dof)

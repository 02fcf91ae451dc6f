"""The saturating power law A - D / C^B as a curve model: the paper's comparison form (App. A.7).

The paper shows that a power law fitted to a run that saturates near 0.65 predicts an asymptote
of 1.0: its A is not a ceiling the data identify, so comparisons of power-law fits compare their
predicted values at the budget, never A (``has_asymptote = False``). ``PowerLawModel`` fits it the
way the sigmoid is fitted: a grid over A (default 0.450..1.000), D and B per cell by batched
Levenberg–Marquardt, the lowest SSE kept, then (``polish_optimum``) polished continuously in
(A, log D, B) inside the grid's range. ``fit_power_law`` is the one-call form.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from scalefit.errors import FitError
from scalefit.models.base import CurveFit, CurveModel
from scalefit.models.curve import power_law
from scalefit.models.lm import batched_lm
from scalefit.models.parameters import ASYMPTOTE, EFFICIENCY, Parameter, Parameters
from scalefit.models.sigmoid import MIN_POINTS, check_curve, fit_window, run_labels
from scalefit.reasons import Reason

POWER_LAW_A_GRID = np.round(np.arange(0.450, 1.0 + 1e-9, 0.005), 3)
LOG_D_BOUNDS = (-50.0, 50.0)
B_BOUNDS = (1e-4, 20.0)


def _residuals(log_c: np.ndarray, y: np.ndarray):
    """Residuals A - D C^-B - y and their Jacobian in (A, log D, B); ``y`` is (1, n) or (rows, n)."""

    def residuals(theta: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a, log_d, b = theta[:, :1], theta[:, 1:2], theta[:, 2:3]
        t = np.exp(log_d - b * log_c)
        r = a - t - (y if len(y) == 1 else y[rows])
        return r, np.stack(np.broadcast_arrays(np.ones_like(t), -t, t * log_c), axis=-1)

    return residuals


@dataclass
class PowerLawFit(CurveFit):
    """The power law's fitted result: A, D, B and the A grid searched."""

    A: float
    D: float
    B: float
    a_grid: np.ndarray | None = None

    name: ClassVar[str] = "power_law"
    param_names: ClassVar[tuple[str, ...]] = ("A", "D", "B")
    sample_names: ClassVar[tuple[str, ...]] = ("A", "D", "B")

    @property
    def parameters(self) -> Parameters:
        """A (an asymptote, not a ceiling the data identify), D and B at their fitted values."""
        a = POWER_LAW_A_GRID if self.a_grid is None else self.a_grid
        return Parameters(
            Parameter("A", self.A, float(a.min()), float(a.max()), ASYMPTOTE, vary=len(a) > 1),
            Parameter("D", self.D, 0.0, np.inf),
            Parameter("B", self.B, *B_BOUNDS, EFFICIENCY),
        )

    def predict(self, compute) -> np.ndarray:
        return power_law(compute, self.A, self.D, self.B)

    def predict_batch(self, samples: np.ndarray, compute) -> np.ndarray:
        c = np.atleast_1d(np.asarray(compute, float))
        return power_law(c[None, :], samples[:, :1], samples[:, 1:2], samples[:, 2:3])

    @property
    def n_free(self) -> int:
        return 3 - (self.a_grid is not None and len(self.a_grid) == 1)

    @property
    def not_identified(self) -> list[Reason]:
        """B on a bound of its range: the curve is flat or a step, no power law."""
        if not B_BOUNDS[0] * 1.01 < self.B < B_BOUNDS[1] * 0.99:
            return [Reason("bound", {"value": self.B}, {"param": "B", "form": "range", "range": str(B_BOUNDS)})]
        return []

    def refit_batch(self, y_draws: np.ndarray) -> np.ndarray:
        """(A, D, B) of every row of ``y_draws`` (values at every input point), refitted at once in
        (A, log D, B) from this fit's optimum; A inside its grid's range (fixed for a one-value grid)."""
        log_x = np.log(self.inputs[0][self.used])[None, :]
        n = len(y_draws)
        a_lo, a_hi = (self.A, self.A) if self.a_grid is None or len(self.a_grid) == 1 else (0.0, 2.0)
        lower = np.array([a_lo, LOG_D_BOUNDS[0], B_BOUNDS[0]])
        upper = np.array([a_hi, LOG_D_BOUNDS[1], B_BOUNDS[1]])
        theta0 = np.tile([self.A, np.log(self.D), self.B], (n, 1))
        theta, _ = batched_lm(_residuals(log_x, y_draws[:, self.used]), theta0, lower, upper, iters=100)
        theta[:, 1] = np.exp(theta[:, 1])
        return theta

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.name, "A": self.A, "D": self.D, "B": self.B, "sse": self.sse}
        out.update(n_points=self.n_points, exclude_below=self.exclude_below, fit_upto=self.fit_upto)
        out["warnings"] = list(self.warnings)
        extrap = self.extrapolation()
        if extrap is not None:
            out["extrapolation"] = extrap
        return out


class PowerLawModel(CurveModel):
    """A - D / C^B as a curve model (settings; ``fit`` makes ``result_``, a ``PowerLawFit``).

    exclude_below / fit_upto: as the sigmoid's. a_grid: A values (default 0.450..1.000 step 0.005).
    polish_optimum: polish the grid's winner continuously in A too (default).
    """

    name = "power_law"
    param_names = PowerLawFit.param_names
    parameters = Parameters(
        Parameter("A", np.nan, float(POWER_LAW_A_GRID.min()), float(POWER_LAW_A_GRID.max()), ASYMPTOTE),
        Parameter("D", np.nan, 0.0, np.inf),
        Parameter("B", np.nan, *B_BOUNDS, EFFICIENCY),
    )

    def __init__(
        self,
        *,
        exclude_below: float | None = None,
        fit_upto: float | None = None,
        a_grid=None,
        polish_optimum: bool = True,
    ) -> None:
        self.exclude_below = exclude_below
        self.fit_upto = fit_upto
        self.a_grid = a_grid
        self.polish_optimum = polish_optimum

    def fit(self, compute, values, runs=None) -> PowerLawModel:
        c_all, v_all = check_curve(compute, values)
        runs_all = np.zeros(len(c_all), dtype=int) if runs is None else run_labels(runs, len(c_all))
        use, held = fit_window(c_all, self.exclude_below, self.fit_upto)
        c, y = c_all[use], v_all[use]
        if len(c) < MIN_POINTS:
            raise FitError(
                f"only {len(c)} point(s) with compute > 0 to fit the power law to; need at least {MIN_POINTS}"
            )
        if c.max() <= c.min() * (1.0 + 1e-9):
            raise FitError(f"every fitted point has the same compute ({c.min():g}): no compute range to fit a curve to")
        a = POWER_LAW_A_GRID if self.a_grid is None else np.atleast_1d(np.asarray(self.a_grid, float))
        i, (A, log_d, B), best = _least_squares(np.log(c), y, a, self.polish_optimum)
        notes = []
        if len(a) > 1 and i in (0, len(a) - 1):
            notes.append(
                f"A = {A:.3f} is at the {'lower' if i == 0 else 'upper'} edge of the power law's A grid "
                f"[{a[0]:.3f}, {a[-1]:.3f}]: its asymptote is not identified (its predictions within the data are)"
            )
        for note in notes:
            warnings.warn(note, stacklevel=2)
        self.result_ = PowerLawFit(
            A=A,
            D=float(np.exp(log_d)),
            B=B,
            a_grid=a,
            sse=best,
            compute=c,
            value=y,
            heldout_compute=c_all[held],
            heldout_value=v_all[held],
            warnings=notes,
            inputs=(c_all, v_all),
            used=use,
            run_inputs=runs_all,
            model=self.clone(),
        )
        if self.result_.not_identified:
            self.result_.warnings += self.result_.not_identified
        return self


def _least_squares(
    log_c: np.ndarray, y: np.ndarray, a: np.ndarray, polish_optimum: bool
) -> tuple[int, tuple[float, float, float], float]:
    """The least squares power law: (log D, B) fitted at every A of the grid, the best cell (its index),
    then polished over all three where asked; the index, (A, log D, B) and the sum of squares."""
    # Start each cell from the straight line log(A - y) = log D - B log C.
    gap = np.log(np.clip(a[:, None] - y[None, :], 1e-4, None))
    slope = np.polyfit(log_c, gap.T, 1)
    theta0 = np.stack([slope[1], np.clip(-slope[0], 1e-3, 10.0)], axis=1)
    full = _residuals(log_c, y[None, :])

    def residuals(theta: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r, jac = full(np.column_stack([a[rows], theta]), rows)
        return r, jac[..., 1:]

    lo, hi = np.array([LOG_D_BOUNDS[0], B_BOUNDS[0]]), np.array([LOG_D_BOUNDS[1], B_BOUNDS[1]])
    theta, sse = batched_lm(residuals, theta0, lo, hi)
    i = int(np.argmin(sse))
    A, log_d, B, best = float(a[i]), float(theta[i, 0]), float(theta[i, 1]), float(sse[i])
    if polish_optimum and len(a) > 1:
        lower = np.array([a.min(), LOG_D_BOUNDS[0], B_BOUNDS[0]])
        upper = np.array([a.max(), LOG_D_BOUNDS[1], B_BOUNDS[1]])
        th, p_sse = batched_lm(full, np.array([[A, log_d, B]]), lower, upper, iters=200)
        if p_sse[0] <= best:
            (A, log_d, B), best = (float(x) for x in th[0]), float(p_sse[0])
    return i, (A, log_d, B), best


def fit_power_law(
    compute, value, *, exclude_below: float | None = None, fit_upto: float | None = None, a_grid=None, runs=None
) -> PowerLawFit:
    """``PowerLawModel(...).fit(compute, value, runs).result_``."""
    model = PowerLawModel(exclude_below=exclude_below, fit_upto=fit_upto, a_grid=a_grid)
    return model.fit(compute, value, runs=runs).result_

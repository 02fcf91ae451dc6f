"""A fit model made of its declaration and its curve alone (``LeastSquaresModel``), the base of a
new model: it declares ``parameters`` (``scalefit.models.parameters``) and a vectorised ``curve``, and gets
the fit, the batched refits of the bootstrap, ``fix`` and the identification checks from here.

The fit: least squares by batched Levenberg–Marquardt (``scalefit.models.parameters.fit_declared``) inside
the declared bounds, started from the declared start values (``guess`` may scale them to the
data) with the ceiling at ``N_CEILING_STARTS`` values across its range, the lowest SSE kept. A
varying parameter that ends on a bound of its range is not identified.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from scalefit.errors import FitError
from scalefit.models.base import CurveFit, CurveModel
from scalefit.models.parameters import START, Curve, Parameters, fit_declared
from scalefit.models.sigmoid import MIN_POINTS, check_curve, fit_window, run_labels
from scalefit.reasons import Reason

N_CEILING_STARTS = 8


@dataclass(kw_only=True)
class LeastSquaresFit(CurveFit):
    """The fitted result of a ``LeastSquaresModel``: its declaration at the fitted values."""

    declared: Parameters
    curve: Curve = field(repr=False)

    @property
    def parameters(self) -> Parameters:
        return self.declared

    @property
    def sample_names(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.declared.names

    @property
    def param_names(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(p.name for p in self.declared if p.role != START)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.model.name

    @property
    def n_free(self) -> int:
        return sum(p.vary for p in self.declared)

    def predict(self, compute) -> np.ndarray:
        c = np.asarray(compute, float)
        return np.asarray(self.curve(c, *self.declared.values), float) * np.ones_like(c)

    def predict_batch(self, samples: np.ndarray, compute) -> np.ndarray:
        c = np.atleast_1d(np.asarray(compute, float))[None, :]
        out = self.curve(c, *(samples[:, i : i + 1] for i in range(samples.shape[1])))
        return np.broadcast_to(out, (len(samples), c.shape[1])).copy()

    @property
    def not_identified(self) -> list[Reason]:
        return [
            Reason("bound", {"value": p.value, "lo": p.min, "hi": p.max}, {"param": p.name})
            for p in self.declared
            if p.on_bound()
        ]

    def refit_batch(self, y_draws: np.ndarray) -> np.ndarray:
        starts = np.tile(self.declared.values, (len(y_draws), 1))
        theta, _ = fit_declared(self.curve, self.declared, self.compute, y_draws[:, self.used], starts, iters=100)
        return theta

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.name, **{p.name: p.value for p in self.declared}, "sse": self.sse}
        out.update(n_points=self.n_points, exclude_below=self.exclude_below, fit_upto=self.fit_upto)
        out["warnings"] = list(self.warnings)
        return out


class LeastSquaresModel(CurveModel):
    """A model from its declaration (``parameters``) and ``curve(compute, *parameters)``, which must
    broadcast: each parameter may come as a column (rows, 1) against compute (1, points).

    exclude_below / fit_upto: as the sigmoid's. a_grid: the ceiling's (or asymptote's) range, its
    smallest and largest values (one value: held there). fixed: parameters held, ``{name: value}``.
    """

    curve: ClassVar[Curve]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.param_names = tuple(p.name for p in cls.parameters if p.role != START)  # the table's columns

    def __init__(
        self,
        *,
        exclude_below: float | None = None,
        fit_upto: float | None = None,
        a_grid=None,
        fixed: dict[str, float] | None = None,
    ) -> None:
        self.exclude_below = exclude_below
        self.fit_upto = fit_upto
        self.a_grid = a_grid
        self.fixed = fixed

    def guess(self, compute: np.ndarray, values: np.ndarray) -> dict[str, float]:
        """Start values scaled to the fitted points (default: the declared ones)."""
        return {}

    def fix_settings(self, name: str, value: float) -> dict[str, Any]:
        if name == self.parameters.asymptote:
            return super().fix_settings(name, value)
        return {"fixed": {**(self.fixed or {}), name: float(value)}}

    def declaration(self, compute: np.ndarray, values: np.ndarray) -> Parameters:
        """The declared parameters with these settings: the start guesses, the ceiling's range, the held ones."""
        declared = self.parameters
        for name, value in self.guess(compute, values).items():
            declared = declared.update(**{name: replace(declared[name], value=float(value))})
        top = declared.asymptote
        if self.a_grid is not None and top is not None:
            a = np.atleast_1d(np.asarray(self.a_grid, float))
            declared = declared.bounded(top, float(a.min()), float(a.max()))
        for name, value in (self.fixed or {}).items():
            declared = declared.fix(name, value)
        return declared

    def fit(self, compute, values, runs=None) -> LeastSquaresModel:
        c_all, v_all = check_curve(compute, values)
        runs_all = np.zeros(len(c_all), dtype=int) if runs is None else run_labels(runs, len(c_all))
        use, held = fit_window(c_all, self.exclude_below, self.fit_upto)
        c, y = c_all[use], v_all[use]
        if len(c) < MIN_POINTS:
            raise FitError(f"only {len(c)} point(s) with compute > 0 to fit {self.name} to; need at least {MIN_POINTS}")
        if c.max() <= c.min() * (1.0 + 1e-9):
            raise FitError(f"every fitted point has the same compute ({c.min():g}): no compute range to fit a curve to")
        declared = self.declaration(c, y)
        starts = np.tile(declared.values, (N_CEILING_STARTS, 1))
        top = declared.asymptote
        if top is not None and declared[top].vary and np.isfinite([declared[top].min, declared[top].max]).all():
            starts[:, declared.names.index(top)] = np.linspace(declared[top].min, declared[top].max, N_CEILING_STARTS)
        theta, sse = fit_declared(type(self).curve, declared, c, y[None, :], starts)
        best = int(np.nanargmin(sse))
        fitted = declared.with_values(theta[best])
        result = LeastSquaresFit(
            declared=fitted,
            curve=type(self).curve,
            sse=float(sse[best]),
            compute=c,
            value=y,
            heldout_compute=c_all[held],
            heldout_value=v_all[held],
            inputs=(c_all, v_all),
            used=use,
            run_inputs=runs_all,
            model=self.clone(),
        )
        result.warnings = result.not_identified
        for note in result.warnings:
            warnings.warn(note, stacklevel=2)
        self.result_ = result
        return self

"""The curve-model interface: what forecasts, comparisons, plots and tables need of a fit model.

Two halves, in the spirit of scikit-learn estimators:

- ``CurveModel``, the estimator: settings only, given to the constructor (grids, bounds,
  ``exclude_below``, ``fit_upto``...). ``fit(compute, values, runs=None)`` returns the model itself
  with one fitted attribute, ``result_``; ``predict``, ``params``, ``param_names`` and
  ``identified()`` read it. ``get_params`` / ``set_params`` / ``clone`` give the unfitted copies that
  refits (backtest prefixes, a comparison's shared asymptote) are made with.
- ``CurveFit``, the result: the input data (every point, which were fitted, which were held out,
  the run of each), the fitted parameters, and the model (an unfitted clone) that made it. Every
  consumer reads a ``CurveFit``: ``predict``, ``params``, ``identified()`` (why the fit is not
  identified; empty when it is), ``refit(**settings)`` (the same data through ``model.clone``),
  and, for the correlated bootstrap, ``refit_batch(y_draws)`` (many simulated data sets refitted
  at once, the model's own vectorised implementation) and ``predict_batch(samples, compute)``.

Every model declares its parameters (``parameters``, a ``scalefit.models.parameters.Parameters``: names,
bounds, start values, which is the ceiling, which are efficiency parameters), and every fit gives
them at its fitted values (``CurveFit.parameters``): comparisons, open ceilings, the knee test, the
table and slower-or-lower read the roles there, never a model's parameter names.
``CurveModel.fix(name, value)`` is the model with one parameter held (a refit at a shared ceiling).

The implementations: ``scalefit.models.sigmoid.SigmoidModel`` (the ScaleRL sigmoid, the default),
``scalefit.models.powerlaw.PowerLawModel`` (the paper's power-law comparison) and
``scalefit.models.declared.LeastSquaresModel``, a model made of its declaration and its curve alone.
``scalefit.models.registry.make_model(name, ...)`` builds one by its campaign name (``fit.model``).
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from scalefit.errors import FitError
from scalefit.models.parameters import Parameters
from scalefit.reasons import Reason


@dataclass(kw_only=True)
class CurveFit:
    """One fitted curve: its data, its parameters (in the subclass) and the model that made it."""

    compute: np.ndarray  # the fitted points' compute
    value: np.ndarray
    heldout_compute: np.ndarray  # points past ``fit_upto``: predicted, never fitted
    heldout_value: np.ndarray
    sse: float
    warnings: list[str] = field(default_factory=list)
    inputs: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)  # every input point
    used: np.ndarray | None = field(default=None, repr=False)  # which input points were fitted
    run_inputs: np.ndarray | None = field(default=None, repr=False)  # run label of each input point
    model: CurveModel | None = field(default=None, repr=False)  # the settings (an unfitted clone)

    name: ClassVar[str] = ""  # the model's name in a campaign's fit.model
    param_names: ClassVar[tuple[str, ...]] = ()
    sample_names: ClassVar[tuple[str, ...]] = ()  # columns of refit_batch's draws (params + nuisances)

    @property
    def parameters(self) -> Parameters:
        """The model's declaration at the fitted values, with the ranges this fit searched."""
        raise NotImplementedError

    @property
    def params(self) -> dict[str, float]:
        declared = self.parameters
        return {p: float(declared[p].value) for p in self.param_names}

    @property
    def has_asymptote(self) -> bool:
        """The model has a ceiling the data identify (comparisons use it)."""
        return self.parameters.ceiling is not None

    @property
    def start_level(self) -> float | None:
        """The level before training, where the model has it as a parameter (the sigmoid's R0)."""
        start = self.parameters.start
        return None if start is None else float(self.parameters[start].value)

    @property
    def ceiling_at_edge(self) -> bool:
        """The ceiling on an edge of the range searched: the optimum may lie outside."""
        ceiling = self.parameters.ceiling
        return ceiling is not None and self.parameters[ceiling].on_bound()

    @property
    def efficiency_at_bound(self) -> bool:
        """The compared efficiency parameter on a bound of its range: the curve's shape is not identified."""
        eff = self.parameters.efficiency
        return bool(eff) and self.parameters[eff[0]].on_bound()

    def pooling(self) -> tuple[Any, str]:
        """The campaign prior this fit was pooled with (None: alone) and why it was left out of it."""
        return None, ""

    def compute_at_share(self, samples: np.ndarray, share: np.ndarray) -> np.ndarray:
        """Compute at which each row of ``samples`` reaches ``share`` of its own gain, from its level at
        zero compute to its ceiling (inf where it does not within 10^6 times the fitted compute)."""
        ceiling = self.parameters.ceiling
        names = self.parameters.names
        grid = np.geomspace(float(self.compute.min()) * 1e-6, float(self.compute.max()) * 1e6, 4001)
        start = self.predict_batch(samples, np.array([0.0]))[:, 0]
        target = start + share * (samples[:, names.index(ceiling)] - start)
        curves = self.predict_batch(samples, grid)
        reached = curves >= target[:, None]
        i = np.argmax(reached, axis=1)
        hit = reached.any(axis=1) & (share > 0) & (share < 1)
        rows = np.arange(len(samples))
        j = np.maximum(i - 1, 0)
        lo, hi = curves[rows, j], curves[rows, i]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.clip(np.where(hi > lo, (target - lo) / (hi - lo), 1.0), 0.0, 1.0)
        log_c = np.log(grid[j]) + t * (np.log(grid[i]) - np.log(grid[j]))
        return np.where(hit, np.exp(log_c), np.inf)

    @property
    def n_points(self) -> int:
        return len(self.compute)

    @property
    def n_free(self) -> int:
        """Parameters the fit estimated (residual degrees of freedom are points minus these)."""
        return len(self.param_names)

    @property
    def exclude_below(self) -> float | None:
        return None if self.model is None else self.model.exclude_below

    @property
    def fit_upto(self) -> float | None:
        return None if self.model is None else self.model.fit_upto

    def predict(self, compute) -> np.ndarray:
        raise NotImplementedError

    def predict_batch(self, samples: np.ndarray, compute) -> np.ndarray:
        """Curves (rows of ``samples``, in ``sample_names`` order) at each compute: (rows, points)."""
        raise NotImplementedError

    def refit_batch(self, y_draws: np.ndarray) -> np.ndarray:
        """Refit many simulated data sets at once: ``y_draws`` (rows, input points) are values at
        every input point; returns (rows, len(sample_names)) draws."""
        raise NotImplementedError

    @property
    def not_identified(self) -> list[Reason]:
        """Why the optimum itself is not identified by the points (a parameter on the edge of its
        grid or range); empty when it is."""
        return []

    def identified(self) -> list[Reason]:
        """Every reason the fit cannot yet be trusted beyond its data (``not_identified`` and, for a
        model with a knee, the knee not reached); empty when it is identified."""
        return self.not_identified

    def more_compute(self) -> float | None:
        """A factor on the fitted compute that would identify the fit (None: no estimate)."""
        return None

    def series_mask(self) -> np.ndarray:
        """Input points each run's residual series (the noise model) runs over."""
        return self.used

    def refit(self, **settings: Any) -> CurveFit:
        """The same data fitted again with some settings changed (e.g. ``fit_upto=...``)."""
        return self.model.clone(**settings).fit(*self.inputs, runs=self.run_inputs).result_

    def refit_fixed(self, name: str, value: float) -> CurveFit:
        """The same data fitted again with parameter ``name`` held at ``value`` (``CurveModel.fix``)."""
        return self.refit(**self.model.fix_settings(name, value))

    def prefix(self, upto: float) -> CurveFit:
        """The fit to the points up to ``upto`` (a backtest's origin), settings scaled to them."""
        return self.refit(fit_upto=upto)

    def extrapolation(self) -> dict[str, float] | None:
        """Error of the fit on the held-out points beyond ``fit_upto`` (None if there are none)."""
        if len(self.heldout_compute) == 0:
            return None
        err = self.predict(self.heldout_compute) - self.heldout_value
        last = int(np.argmax(self.heldout_compute))
        return {
            "n_heldout": int(len(err)),
            "mae": float(np.mean(np.abs(err))),
            "max_abs_error": float(np.max(np.abs(err))),
            "final_compute": float(self.heldout_compute[last]),
            "final_observed": float(self.heldout_value[last]),
            "final_predicted": float(self.predict(self.heldout_compute[last])),
            "final_error": float(err[last]),
        }

    def describe(self) -> str:
        """The parameters in one line, e.g. for a plot's legend."""
        return " ".join(f"{k}={v:.3g}" for k, v in self.params.items())


class CurveModel:
    """A curve model's settings; ``fit`` makes its ``result_`` (a ``CurveFit``). Every model takes
    ``exclude_below``, ``fit_upto`` and ``a_grid`` (the grid, or range, of its ceiling or asymptote:
    a campaign's ``fit.a_grid``)."""

    name: ClassVar[str] = ""
    param_names: ClassVar[tuple[str, ...]] = ()
    parameters: ClassVar[Parameters] = Parameters()  # the declaration: names, bounds, roles, start values
    pools: ClassVar[bool] = False  # the joint fit (fit.pooling: partial, scalefit.forecasts.pooled_fit) takes it
    exclude_below: float | None = None
    fit_upto: float | None = None
    result_: CurveFit

    def get_params(self) -> dict[str, Any]:
        """The settings, by the constructor's argument names."""
        names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        return {n: getattr(self, n) for n in names}

    def set_params(self, **settings: Any) -> CurveModel:
        """Change settings in place (unknown names are an error); returns the model."""
        known = self.get_params()
        for key, value in settings.items():
            if key not in known:
                raise FitError(f"{type(self).__name__} has no setting {key!r}; settings: {', '.join(known)}")
            setattr(self, key, value)
        return self

    def clone(self, **settings: Any) -> CurveModel:
        """An unfitted copy with the same settings (some changed)."""
        return type(self)(**{**copy.deepcopy(self.get_params()), **settings})

    def fix_settings(self, name: str, value: float) -> dict[str, Any]:
        """The settings that hold parameter ``name`` at ``value``: the asymptote's grid of one value."""
        if name != self.parameters.asymptote:
            raise FitError(f"{type(self).__name__} can hold only {self.parameters.asymptote} fixed, not {name!r}")
        return {"a_grid": np.array([float(value)])}

    def fix(self, name: str, value: float) -> CurveModel:
        """An unfitted copy with parameter ``name`` held at ``value`` (a refit at a shared ceiling)."""
        return self.clone(**self.fix_settings(name, value))

    def fit(self, compute, values, runs=None) -> CurveModel:
        raise NotImplementedError

    def _fitted(self) -> CurveFit:
        if not hasattr(self, "result_"):
            raise FitError(f"{type(self).__name__} is not fitted yet: call fit(compute, values) first")
        return self.result_

    @property
    def params(self) -> dict[str, float]:
        return self._fitted().params

    def predict(self, compute) -> np.ndarray:
        return self._fitted().predict(compute)

    def identified(self) -> list[Reason]:
        return self._fitted().identified()

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items() if v is not None)
        return f"{type(self).__name__}({args})"

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

The implementations: ``scalefit.fit.SigmoidModel`` (the ScaleRL sigmoid, the default) and
``scalefit.powerlaw.PowerLawModel`` (the paper's power-law comparison). ``scalefit.models.make_model(name, ...)``
builds one by its campaign name (``fit.model``).
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from scalefit.errors import FitError


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
    has_asymptote: ClassVar[bool] = True  # A is a ceiling the data identify (comparisons use it)

    @property
    def params(self) -> dict[str, float]:
        return {p: float(getattr(self, p)) for p in self.param_names}

    @property
    def n_points(self) -> int:
        return len(self.compute)

    @property
    def n_free(self) -> int:
        """Parameters the fit estimated (residual degrees of freedom are points minus these)."""
        return len(self.param_names)

    @property
    def exclude_below(self) -> float | None:
        return getattr(self.model, "exclude_below", None)

    @property
    def fit_upto(self) -> float | None:
        return getattr(self.model, "fit_upto", None)

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
    def not_identified(self) -> list[str]:
        """Why the optimum itself is not identified by the points (a parameter on the edge of its
        grid or range); empty when it is."""
        return []

    def identified(self) -> list[str]:
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
    """A curve model's settings; ``fit`` makes its ``result_`` (a ``CurveFit``)."""

    name: ClassVar[str] = ""
    param_names: ClassVar[tuple[str, ...]] = ()
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

    def identified(self) -> list[str]:
        return self._fitted().identified()

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items() if v is not None)
        return f"{type(self).__name__}({args})"

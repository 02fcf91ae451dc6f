"""A fit model's declaration of its parameters, in the way lmfit's ``Parameters`` are: names, bounds,
start values, whether each is fitted, and its role, which is what model-independent code reads.

The roles:

- ``CEILING``: the asymptote the data identify. Comparisons read it (the paper's rule compares it;
  within the margin the arms are refitted with it held at their mean, ``fix``), the table shows its
  interval, an open ceiling refits at the top of its range, and a campaign's ``fit.a_grid`` is its
  grid (or range).
- ``ASYMPTOTE``: a limit the data do not identify (the power law's A): shown, never compared.
- ``EFFICIENCY``: how fast the curve approaches its ceiling; the first one declared is the one the
  paper's rule compares at a shared ceiling, where higher is more compute-efficient.
- ``START``: the level before any training (the sigmoid's R0); the knee test counts the gain from it.
- ``SHAPE``: anything else.

``Parameters.fix(name, value)`` holds one parameter at a value (a refit at a shared ceiling);
``fit_declared`` fits the declared, varying parameters of any vectorised curve by batched
Levenberg–Marquardt inside their bounds, many data sets at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from scalefit.errors import FitError
from scalefit.models.lm import batched_lm

CEILING, ASYMPTOTE, EFFICIENCY, START, SHAPE = "ceiling", "asymptote", "efficiency", "start", "shape"
ROLES = (CEILING, ASYMPTOTE, EFFICIENCY, START, SHAPE)
ON_BOUND = 0.01  # within this share of a bound (of the range's width where a bound is 0 or negative): on it


@dataclass(frozen=True)
class Parameter:
    """One parameter: its name, value (the start value in a model's declaration, the fitted value in a
    fit's), bounds, role and whether the fit varies it (False: held at ``value``)."""

    name: str
    value: float = np.nan
    min: float = -np.inf
    max: float = np.inf
    role: str = SHAPE
    vary: bool = True

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise FitError(f"parameter {self.name}: role {self.role!r} is not one of {', '.join(ROLES)}")
        if not self.min <= self.max:
            raise FitError(f"parameter {self.name}: min {self.min} > max {self.max}")

    def on_bound(self, value: float | None = None) -> bool:
        """Whether ``value`` (default its own) lies on a bound of its range, within ``ON_BOUND``."""
        v, lo, hi = self.value if value is None else value, self.min, self.max
        if not self.vary or lo == hi:
            return False
        width = hi - lo if np.isfinite(hi - lo) else 0.0  # a range open on one side: on a bound only at it
        low = lo * (1 + ON_BOUND) if lo > 0 else lo + ON_BOUND * width
        high = hi * (1 - ON_BOUND) if hi > 0 else hi - ON_BOUND * width
        return not low < v < high


class Parameters:
    """An ordered, immutable set of ``Parameter``; its order is the order of a fit's parameter draws."""

    def __init__(self, *params: Parameter) -> None:
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            raise FitError(f"parameter names repeat: {', '.join(names)}")
        for role in (CEILING, START):
            if sum(p.role == role for p in params) > 1:
                raise FitError(f"more than one {role} parameter: {', '.join(p.name for p in params if p.role == role)}")
        self._params = {p.name: p for p in params}

    def __getitem__(self, name: str) -> Parameter:
        if name not in self._params:
            raise FitError(f"no parameter {name!r}; parameters: {', '.join(self.names)}")
        return self._params[name]

    def __iter__(self) -> Iterator[Parameter]:
        return iter(self._params.values())

    def __len__(self) -> int:
        return len(self._params)

    def __contains__(self, name: object) -> bool:
        return name in self._params

    def __repr__(self) -> str:
        return f"Parameters({', '.join(map(repr, self))})"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._params)

    def _role(self, role: str) -> str | None:
        return next((p.name for p in self if p.role == role), None)

    @property
    def ceiling(self) -> str | None:
        """The ceiling's name (None: the model has no ceiling the data identify)."""
        return self._role(CEILING)

    @property
    def asymptote(self) -> str | None:
        """The ceiling, else a limit the data do not identify (the power law's A), else None."""
        return self._role(CEILING) or self._role(ASYMPTOTE)

    @property
    def efficiency(self) -> tuple[str, ...]:
        """The efficiency parameters; the first is compared at a shared ceiling (higher: more efficient)."""
        return tuple(p.name for p in self if p.role == EFFICIENCY)

    @property
    def start(self) -> str | None:
        """The level before training (None: not a parameter of the model)."""
        return self._role(START)

    @property
    def values(self) -> np.ndarray:
        return np.array([p.value for p in self], float)

    def update(self, **changes: Parameter) -> Parameters:
        return Parameters(*(changes.get(p.name, p) for p in self))

    def with_values(self, values) -> Parameters:
        """The same declaration at ``values`` (one per parameter, in order)."""
        return Parameters(*(replace(p, value=float(v)) for p, v in zip(self, values, strict=True)))

    def fix(self, name: str, value: float) -> Parameters:
        """``name`` held at ``value`` (a refit at a shared ceiling); the rest as they are."""
        p = self[name]
        return self.update(**{name: replace(p, value=float(value), min=float(value), max=float(value), vary=False)})

    def bounded(self, name: str, lo: float, hi: float) -> Parameters:
        """``name`` searched over [lo, hi] (a campaign's ``fit.a_grid`` for the ceiling); one value: held there."""
        p = self[name]
        if lo == hi:
            return self.fix(name, lo)
        start = float(np.clip(p.value, lo, hi)) if np.isfinite(p.value) else (lo + hi) / 2
        return self.update(**{name: replace(p, min=float(lo), max=float(hi), value=start)})

    @property
    def fixed(self) -> dict[str, float]:
        return {p.name: p.value for p in self if not p.vary}


Curve = Callable[..., np.ndarray]  # curve(compute, *parameters), broadcasting over rows of parameters


def fit_declared(
    curve: Curve, params: Parameters, compute: np.ndarray, y: np.ndarray, starts: np.ndarray, iters: int = 200
) -> tuple[np.ndarray, np.ndarray]:
    """Fit ``curve`` to each row of ``y`` (rows, points) from each row of ``starts`` (rows, parameters),
    the parameters inside their bounds and the held ones at their values: batched Levenberg–Marquardt
    with a forward-difference Jacobian. Returns the parameters (rows, parameters) and each row's SSE."""
    c = np.asarray(compute, float)[None, :]
    lower = np.array([p.min if p.vary else p.value for p in params])
    upper = np.array([p.max if p.vary else p.value for p in params])
    y = np.atleast_2d(np.asarray(y, float))

    def at(theta: np.ndarray) -> np.ndarray:
        return np.broadcast_to(
            curve(c, *(theta[:, i : i + 1] for i in range(theta.shape[1]))), (len(theta), c.shape[1])
        )

    def residuals(theta: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        base = at(theta)
        r = base - (y if len(y) == 1 else y[rows])
        jac = np.empty((*r.shape, theta.shape[1]))
        for i in range(theta.shape[1]):
            h = 1e-7 * np.maximum(np.abs(theta[:, i]), 1e-7)
            step = theta.copy()
            step[:, i] += h
            jac[..., i] = (at(step) - base) / h[:, None]
        return r, jac

    return batched_lm(residuals, np.clip(starts, lower, upper), lower, upper, iters=iters)

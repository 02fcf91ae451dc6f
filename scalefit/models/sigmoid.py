"""Fit R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) the way the ScaleRL paper does.

Procedure (paper §2.1, App. A.5): drop points below a compute threshold; grid-search
A × C_mid; for each cell fit only B by least squares; keep the cell with the lowest
sum of squared errors. All 7,100 cells are solved at once by a batched
scan of B plus Levenberg–Marquardt (``fit_b_grid``), and the winner's B is then
refined with ``scipy.optimize.curve_fit`` — the optimiser the paper names.

The grid quantises A and C_mid (neighbouring C_mid values can be 30% apart), so the
winning cell is then polished continuously in (A, B, log C_mid) inside the grid's range:
the printed point estimate is the least-squares optimum, the same quantity the
uncertainty methods refit. The grid cell is kept (``grid_A``, ``grid_C_mid``) and decides
whether the optimum sits on a grid edge. Memory is bounded for any number of points:
the grid sums are accumulated over chunks of points (``CHUNK_FLOATS``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from scipy.special import expit

from scalefit.errors import FitError
from scalefit.models.base import CurveFit, CurveModel
from scalefit.models.curve import sigmoid, sigmoid_residuals
from scalefit.models.grids import PAPER_A_GRID, PAPER_CMID_GRID, auto_cmid_grid
from scalefit.models.lm import batched_lm
from scalefit.models.parameters import CEILING, EFFICIENCY, START, Parameter, Parameters
from scalefit.reasons import Reason

B_BOUNDS = (1e-3, 50.0)
CHUNK_FLOATS = 4_000_000  # floats per temporary array (32 MB): bounds memory for any n
B_SCAN = np.geomspace(0.02, 40.0, 80)  # ratio 1.1 between neighbours
REFINE_SLACK = 0.05
REFINE_MIN_CELLS = 64


def b_on_bound(B: float) -> bool:
    """B within 1% of an end of ``B_BOUNDS``: the fit ran into its range, B is not identified."""
    return not B_BOUNDS[0] * 1.01 < B < B_BOUNDS[1] * 0.99


def _bound_shape(B: float) -> str:
    """What a curve with B on a bound of its range looks like."""
    return "a step at C_mid" if B > 1 else "flat"


MIN_POINTS = 4
MIN_GAIN = 0.01
KNEE_SHARE = 0.5  # share of the fitted gain reached at the last fitted point: C_fit >= C_mid


@dataclass
class SigmoidFit(CurveFit):
    """The sigmoid's fitted result (``SigmoidModel.result_``): A, B, C_mid, R0 and the grids searched,
    with the data (``CurveFit``) and the settings that made it (``model``)."""

    A: float
    B: float
    C_mid: float
    R0: float
    a_grid: np.ndarray
    cmid_grid: np.ndarray
    grid_A: float = np.nan  # the winning grid cell, before the continuous polish
    grid_C_mid: float = np.nan

    name: ClassVar[str] = "sigmoid"
    param_names: ClassVar[tuple[str, ...]] = ("A", "B", "C_mid")
    sample_names: ClassVar[tuple[str, ...]] = ("A", "B", "C_mid", "R0")

    @property
    def parameters(self) -> Parameters:
        """A, B, C_mid and R0 at their fitted values, A and C_mid over the grids searched."""
        a, cm = self.a_grid, self.cmid_grid
        return Parameters(
            Parameter("A", self.A, float(a.min()), float(a.max()), CEILING, vary=len(a) > 1),
            Parameter("B", self.B, *B_BOUNDS, EFFICIENCY),
            Parameter("C_mid", self.C_mid, float(cm.min()), float(cm.max()), EFFICIENCY, vary=len(cm) > 1),
            Parameter("R0", self.R0, 0.0, 1.0, START, vary=False),
        )

    @property
    def ceiling_at_edge(self) -> bool:
        return self.a_at_edge

    @property
    def efficiency_at_bound(self) -> bool:
        return self.b_at_bound

    def compute_at_share(self, samples: np.ndarray, share: np.ndarray) -> np.ndarray:
        """The sigmoid's own inverse: C_mid (share / (1 - share))^(1 / B) (inf at a share of 1 or more)."""
        b, cm = samples[:, 1], samples[:, 2]
        with np.errstate(divide="ignore", invalid="ignore"):
            c = cm * (share / (1 - share)) ** (1 / b)
        return np.where((share > 0) & (share < 1), c, np.inf)

    @property
    def polished(self) -> bool:
        return self.model is None or bool(self.model.polish_optimum)

    @property
    def cmid_auto(self) -> bool:
        """The C_mid grid is scaled to the data (a prefix refit scales it again)."""
        grid = None if self.model is None else self.model.cmid_grid
        return grid is None or (isinstance(grid, str) and grid == "auto")

    @property
    def a_at_edge(self) -> bool:
        """A's grid optimum is the first or last grid value: the optimum may lie outside the grid."""
        return len(self.a_grid) > 1 and self.grid_A in (self.a_grid[0], self.a_grid[-1])

    @property
    def cmid_at_edge(self) -> bool:
        """C_mid's grid optimum is the first or last grid value."""
        return len(self.cmid_grid) > 1 and self.grid_C_mid in (self.cmid_grid[0], self.cmid_grid[-1])

    @property
    def b_at_bound(self) -> bool:
        """B sits on a bound of its range: at the top the fitted curve is a step at C_mid, at the
        bottom a flat line; either way the sigmoid's shape (B, and with it C_mid) is not identified."""
        return b_on_bound(self.B)

    @property
    def not_identified(self) -> list[Reason]:
        """Why the fitted optimum is not identified by the points (empty when it is): A or C_mid on
        the edge of its grid, B on a bound of its range. Every verdict and plot reads this one list."""
        out = []
        if self.a_at_edge:
            edge = {"value": self.A, "lo": self.a_grid.min(), "hi": self.a_grid.max()}
            out.append(Reason("grid_edge", edge, {"param": "A"}))
        if self.cmid_at_edge:
            edge = {"value": self.C_mid, "lo": self.cmid_grid.min(), "hi": self.cmid_grid.max()}
            out.append(Reason("grid_edge", edge, {"param": "C_mid"}))
        if self.b_at_bound:
            out.append(Reason("bound", {"value": self.B}, {"param": "B", "shape": _bound_shape(self.B)}))
        return out

    def knee_share(self, at: float | None = None) -> float:
        """Share of the fitted gain A - R0 reached at ``at`` (default the last fitted point; 0 without a gain)."""
        gain = self.A - self.R0
        at = float(self.compute.max()) if at is None else at
        return float((self.predict(at) - self.R0) / gain) if gain > 0 else 0.0

    def identified(self) -> list[Reason]:
        """The knee test (``KNEE_SHARE`` of the gain reached at the last fitted point: the data reach
        C_mid) and ``not_identified``; empty when the fit is identified."""
        share = self.knee_share()
        knee = [Reason("knee", {"share": share})]
        return (knee if share < KNEE_SHARE else []) + self.not_identified

    def more_compute(self) -> float | None:
        """C_mid over the fitted compute when the knee is not reached."""
        return self.C_mid / float(self.compute.max()) if self.knee_share() < KNEE_SHARE else None

    @property
    def n_free(self) -> int:
        return 3 - (len(self.a_grid) == 1) - (len(self.cmid_grid) == 1)

    def series_mask(self) -> np.ndarray:
        """The fitted points and the zero-compute evaluations (they measure R0)."""
        c_all, _ = self.inputs
        return self.used | (c_all == c_all.min())

    def predict(self, compute) -> np.ndarray:
        return sigmoid(compute, self.A, self.B, self.C_mid, self.R0)

    def predict_batch(self, samples: np.ndarray, compute) -> np.ndarray:
        c = np.atleast_1d(np.asarray(compute, float))
        A, B, Cm, R0 = (samples[:, i : i + 1] for i in range(4))
        return sigmoid(c[None, :], A, B, Cm, R0)

    def r0_default(self) -> float:
        """R0 as the fit takes it by default: the mean value at the smallest compute."""
        c_all, v_all = self.inputs
        return float(np.mean(v_all[c_all == c_all.min()]))

    def refit_batch(self, y_draws: np.ndarray) -> np.ndarray:
        """(A, B, C_mid, R0) of every row of ``y_draws`` (values at every input point), refitted at
        once by batched Levenberg–Marquardt in (A, B, log C_mid) from this fit's optimum. R0 moves
        with the zero-compute values when it was taken from them, else stays fixed; A and C_mid stay
        fixed where their grid has one value."""
        c_all, _ = self.inputs
        n = len(y_draws)
        base = c_all == c_all.min()
        if self.r0_default() == self.R0:
            r0_draws = self.R0 + (y_draws[:, base] - self.predict(c_all[base])[None, :]).mean(axis=1)
        else:
            r0_draws = np.full(n, self.R0)
        log_x = np.log(c_all[self.used])[None, :]
        y = y_draws[:, self.used]
        r0 = r0_draws[:, None]

        def residuals(theta: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return sigmoid_residuals(theta, log_x, y[rows], r0[rows])

        theta0 = np.tile([self.A, self.B, np.log(self.C_mid)], (n, 1))
        a_fixed, c_fixed = len(self.a_grid) == 1, len(self.cmid_grid) == 1
        lower = np.array(
            [self.A if a_fixed else 0.0, B_BOUNDS[0], np.log(self.C_mid if c_fixed else self.cmid_grid.min() / 10)]
        )
        upper = np.array(
            [self.A if a_fixed else 1.0, B_BOUNDS[1], np.log(self.C_mid if c_fixed else self.cmid_grid.max() * 10)]
        )
        theta, _ = batched_lm(residuals, theta0, lower, upper, iters=100)
        theta[:, 2] = np.exp(theta[:, 2])
        return np.column_stack([theta, r0_draws])

    def describe(self) -> str:
        return f"A={self.A:.3f} B={self.B:.2f} C_mid={self.C_mid:.3g}"

    def refit(self, **settings: Any) -> SigmoidFit:
        """The same data fitted again with some settings changed (e.g. ``a_grid=[0.6]``); the C_mid
        grid searched stays this fit's unless given."""
        settings.setdefault("cmid_grid", self.cmid_grid)
        return super().refit(**settings)

    def prefix(self, upto: float) -> SigmoidFit:
        """The fit to the points up to ``upto``, its C_mid grid scaled to them when this one's was."""
        return self.refit(fit_upto=upto, cmid_grid=None if self.cmid_auto else self.cmid_grid)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.name,
            "A": self.A,
            "B": self.B,
            "C_mid": self.C_mid,
            "R0": self.R0,
            "sse": self.sse,
            "n_points": self.n_points,
            "exclude_below": self.exclude_below,
            "fit_upto": self.fit_upto,
            "grid_A": self.grid_A,
            "grid_C_mid": self.grid_C_mid,
            "a_at_edge": self.a_at_edge,
            "cmid_at_edge": self.cmid_at_edge,
            "b_at_bound": self.b_at_bound,
            "warnings": list(self.warnings),
        }
        extrap = self.extrapolation()
        if extrap is not None:
            out["extrapolation"] = extrap
        return out


def _as_float_array(x, name: str) -> np.ndarray:
    try:
        arr = np.asarray(x, dtype=float).ravel()
    except (TypeError, ValueError):
        raise FitError(f"{name} must be numbers") from None
    bad = np.flatnonzero(~np.isfinite(arr))
    if len(bad):
        raise FitError(
            f"{name} has {len(bad)} NaN/inf value(s), first at index {bad[0]} (0-based); drop or fix those rows"
        )
    return arr


def check_curve(compute, value) -> tuple[np.ndarray, np.ndarray]:
    """Validate one (compute, value) curve; raise FitError with a specific message."""
    c = _as_float_array(compute, "compute")
    v = _as_float_array(value, "value")
    if len(c) != len(v):
        raise FitError(f"compute has {len(c)} points but value has {len(v)}")
    if (c < 0).any():
        i = int(np.flatnonzero(c < 0)[0])
        raise FitError(f"compute must be >= 0; index {i} (0-based) has {c[i]:g}")
    if ((v < 0) | (v > 1)).any():
        i = int(np.flatnonzero((v < 0) | (v > 1))[0])
        raise FitError(f"values are pass rates and must lie in [0, 1]; index {i} (0-based) has {v[i]:g}")
    return c, v


def chunks(n: int, per_item: int, budget: int | None = None) -> list[slice]:
    """Slices of ``range(n)`` so that ``len(slice) * per_item <= budget`` floats (default
    ``CHUNK_FLOATS``; at least one item a slice): every chunked loop of the package (the grid, the
    batched refits, the bootstrap's resamples) bounds its memory with these."""
    step = max(1, (CHUNK_FLOATS if budget is None else budget) // max(per_item, 1))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def fit_b_grid(
    log_c: np.ndarray, y: np.ndarray, r0: float, a_grid: np.ndarray, cmid_grid: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Best B and SSE for every (A, C_mid) cell, shape (len(a_grid), len(cmid_grid)).

    The curve's shape s = 1 / (1 + (C_mid / C)^B) does not depend on A, so for each
    (C_mid, B) the sums S2 = sum(s^2) and S1 = sum(s * (R0 - y)) give every A's SSE at
    once: SSE = D^2 S2 + 2 D S1 + sum((R0 - y)^2), D = A - R0. B is first scanned on a
    fine log grid, then the promising cells are solved exactly by batched
    Levenberg–Marquardt from their best scanned B. Both passes work on chunks of points
    or cells, so memory stays bounded (``CHUNK_FLOATS``) and time grows linearly in n.
    """
    a_grid, cmid_grid = np.asarray(a_grid, float), np.asarray(cmid_grid, float)
    na, nc, n = len(a_grid), len(cmid_grid), len(y)
    e = r0 - y
    d = a_grid - r0
    log_cmid = np.log(cmid_grid)
    s2 = np.zeros((nc, len(B_SCAN)))
    s1 = np.zeros((nc, len(B_SCAN)))
    for part in chunks(n, nc * len(B_SCAN)):
        lr = log_cmid[:, None] - log_c[None, part]  # (nc, m)
        s = expit(-B_SCAN[None, :, None] * lr[:, None, :])  # (nc, nB, m)
        s2 += np.einsum("cbn,cbn->cb", s, s)
        s1 += np.einsum("cbn,n->cb", s, e[part])
    sse_scan = d[:, None, None] ** 2 * s2 + 2.0 * d[:, None, None] * s1 + e @ e  # (na, nc, nB)
    best = np.argmin(sse_scan, axis=2)
    b = B_SCAN[best].ravel()
    sse = np.take_along_axis(sse_scan, best[..., None], axis=2).ravel()

    # Only cells close to the best scanned SSE can win once B is exact.
    k = min(REFINE_MIN_CELLS, len(sse) - 1)
    cutoff = max(sse.min() * (1.0 + REFINE_SLACK), np.partition(sse, k)[k])
    cells = np.flatnonzero(sse <= cutoff)
    for part in chunks(len(cells), 4 * n):
        sub = cells[part]
        dd, lc = d[sub // nc, None], log_cmid[sub % nc, None]

        def residuals(theta: np.ndarray, rows: np.ndarray, dd=dd, lc=lc) -> tuple[np.ndarray, np.ndarray]:
            ll = lc[rows] - log_c[None, :]
            sr = expit(-theta[:, :1] * ll)
            return dd[rows] * sr + e, (-dd[rows] * sr * (1.0 - sr) * ll)[..., None]

        theta, sse_ref = batched_lm(residuals, b[sub, None], np.array([B_BOUNDS[0]]), np.array([B_BOUNDS[1]]))
        better = sse_ref < sse[sub]
        b[sub[better]], sse[sub[better]] = theta[better, 0], sse_ref[better]
    return b.reshape(na, nc), sse.reshape(na, nc)


def polish(
    c: np.ndarray, v: np.ndarray, r0: float, A: float, B: float, C_mid: float, a_range, cmid_range
) -> tuple[float, float, float, float]:
    """Least-squares optimum in (A, B, log C_mid) from the grid's winner, inside the grid's range.

    A parameter whose grid has a single value stays fixed (e.g. the comparison's shared A).
    Returns A, B, C_mid and the SSE.
    """
    log_c = np.log(c)
    free = np.array([a_range[0] < a_range[1], True, cmid_range[0] < cmid_range[1]])
    lower = np.array([a_range[0], B_BOUNDS[0], np.log(cmid_range[0])])
    upper = np.array([a_range[1], B_BOUNDS[1], np.log(cmid_range[1])])
    start = np.array([A, B, np.log(C_mid)])
    wrt = tuple(int(i) for i in np.flatnonzero(free))

    def residuals(theta: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        full = np.tile(start, (len(theta), 1))
        full[:, free] = theta
        return sigmoid_residuals(full, log_c[None, :], v, r0, wrt=wrt)

    theta, sse = batched_lm(residuals, start[None, free], lower[free], upper[free], iters=200)
    out = start.copy()
    out[free] = theta[0]
    return float(out[0]), float(out[1]), float(np.exp(out[2])), float(sse[0])


def edge_warnings(a_grid, cmid_grid, ia: int, ic: int) -> list[str]:
    """The fit's warnings when its grid cell (``ia``, ``ic``) lies on an edge of the A or C_mid grid."""
    out = []
    if len(a_grid) > 1 and ia in (0, len(a_grid) - 1):
        way = "down" if ia == 0 else "up"
        out.append(
            f"A = {a_grid[ia]:.3f} is at the {'lower' if ia == 0 else 'upper'} edge of the A grid "
            f"[{a_grid[0]:.3f}, {a_grid[-1]:.3f}]; the optimum may lie outside: widen the grid {way}wards "
            "(--a-grid LO:HI:STEP)"
        )
    if len(cmid_grid) > 1 and ic in (0, len(cmid_grid) - 1):
        way = "down" if ic == 0 else "up"
        out.append(
            f"C_mid = {cmid_grid[ic]:.4g} is at the {'lower' if ic == 0 else 'upper'} edge of the C_mid grid "
            f"[{cmid_grid[0]:.4g}, {cmid_grid[-1]:.4g}]; widen it {way}wards (--cmid-grid LO:HI:N)"
        )
    return out


class SigmoidModel(CurveModel):
    """The ScaleRL sigmoid as a curve model (settings; ``fit`` makes ``result_``, a ``SigmoidFit``).

    r0: pass rate at zero RL compute; default the value at the smallest compute (mean if
      several curves share it). exclude_below: drop points with compute below this.
    fit_upto: fit only points with compute <= this; later points are held out for
      ``SigmoidFit.extrapolation``. a_grid: A values (default 0.450..0.800 step 0.005).
    cmid_grid: C_mid values, ``"paper"`` for 100 linear values in [100, 40000] GPU-hours,
      or ``None``/``"auto"`` for 100 linear values in [C_max / 100, 4 C_max] of the fitted data.
    polish_optimum: polish the grid's winner continuously (default); False gives the paper's
      procedure exactly (grid values of A and C_mid).
    """

    name = "sigmoid"
    param_names = SigmoidFit.param_names
    parameters = Parameters(
        Parameter("A", np.nan, float(PAPER_A_GRID.min()), float(PAPER_A_GRID.max()), CEILING),
        Parameter("B", np.nan, *B_BOUNDS, EFFICIENCY),
        Parameter("C_mid", np.nan, 0.0, np.inf, EFFICIENCY),
        Parameter("R0", np.nan, 0.0, 1.0, START, vary=False),
    )
    pools = True

    def __init__(
        self,
        *,
        r0: float | None = None,
        exclude_below: float | None = None,
        fit_upto: float | None = None,
        a_grid=None,
        cmid_grid=None,
        polish_optimum: bool = True,
    ) -> None:
        self.r0 = r0
        self.exclude_below = exclude_below
        self.fit_upto = fit_upto
        self.a_grid = a_grid
        self.cmid_grid = cmid_grid
        self.polish_optimum = polish_optimum

    def fit(self, compute, values, runs=None) -> SigmoidModel:
        """Fit one curve (or several runs' points concatenated; ``runs``: the run of each point,
        which the uncertainty methods treat as one correlated series each). Returns the model."""
        c_all, v_all = check_curve(compute, values)
        if len(c_all) == 0:
            raise FitError("no points to fit")
        runs_all = np.zeros(len(c_all), dtype=int) if runs is None else run_labels(runs, len(c_all))
        r0 = _start_level(self.r0, c_all, v_all)
        use, held = fit_window(c_all, self.exclude_below, self.fit_upto)
        c, v = c_all[use], v_all[use]
        _check_fit_points(c, v, r0, self.exclude_below, self.fit_upto)
        a_grid, cmid_grid = _search_grids(self.a_grid, self.cmid_grid, c)
        best = _best_on_grid(c, v, r0, a_grid, cmid_grid, self.polish_optimum)
        notes = _fit_notes(a_grid, cmid_grid, best)
        for note in notes:
            warnings.warn(note, stacklevel=2)
        self.result_ = SigmoidFit(
            A=best.A,
            B=best.B,
            C_mid=best.C_mid,
            R0=float(r0),
            sse=best.sse,
            compute=c,
            value=v,
            heldout_compute=c_all[held],
            heldout_value=v_all[held],
            a_grid=a_grid,
            cmid_grid=cmid_grid,
            warnings=notes,
            inputs=(c_all, v_all),
            grid_A=best.grid_A,
            grid_C_mid=best.grid_C_mid,
            used=use,
            run_inputs=runs_all,
            model=self.clone(),
        )
        return self


def _start_level(r0: float | None, c_all: np.ndarray, v_all: np.ndarray) -> float:
    """R0 as given (checked to lie in [0, 1]), or the mean value at the smallest compute."""
    if r0 is None:
        return float(np.mean(v_all[c_all == c_all.min()]))
    if not 0.0 <= r0 <= 1.0:
        raise FitError(f"r0 must lie in [0, 1], got {r0}")
    return r0


def fit_window(c_all: np.ndarray, exclude_below: float | None, fit_upto: float | None) -> tuple[np.ndarray, np.ndarray]:
    """The points fitted (compute > 0, within the window) and those held out (above ``fit_upto``)."""
    keep = c_all > 0
    if exclude_below is not None:
        keep &= c_all >= exclude_below
    held = keep & (c_all > fit_upto) if fit_upto is not None else np.zeros_like(keep)
    return keep & ~held, held


def _check_fit_points(
    c: np.ndarray, v: np.ndarray, r0: float, exclude_below: float | None, fit_upto: float | None
) -> None:
    """Refuse points that cannot identify a sigmoid: too few, one compute only, or no gain over R0."""
    if len(c) < MIN_POINTS:
        raise FitError(
            f"only {len(c)} point(s) with compute > 0"
            + (f", >= {exclude_below:g} (--exclude-below)" if exclude_below is not None else "")
            + (f", <= {fit_upto:g} (--fit-upto)" if fit_upto is not None else "")
            + f"; need at least {MIN_POINTS}"
        )
    if c.max() <= c.min() * (1.0 + 1e-9):
        raise FitError(
            f"every fitted point has the same compute ({c.min():g}): there is no compute range to fit a curve to; "
            "check the compute column"
        )
    order = np.argsort(c)
    tail = v[order][-max(2, len(c) // 4) :]
    gain = float(tail.mean() - r0)
    if gain < MIN_GAIN:
        raise FitError(Reason("flat", {"end": tail.mean(), "R0": r0, "gain": gain, "min_gain": MIN_GAIN}))


def _search_grids(a_grid, cmid_grid, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The A and C_mid grids searched: the paper's, automatic (from the largest compute) or given."""
    a_grid = PAPER_A_GRID if a_grid is None else np.atleast_1d(np.asarray(a_grid, float))
    if isinstance(cmid_grid, str) and cmid_grid == "paper":
        cmid_grid = PAPER_CMID_GRID
    elif cmid_grid is None or (isinstance(cmid_grid, str) and cmid_grid == "auto"):
        cmid_grid = auto_cmid_grid(float(c.max()))
    else:
        cmid_grid = np.atleast_1d(np.asarray(cmid_grid, float))
    if (cmid_grid <= 0).any():
        raise FitError("every C_mid grid value must be > 0")
    return a_grid, cmid_grid


@dataclass(frozen=True)
class _GridBest:
    """The best grid cell (indices and values) and the optimum after refining B and polishing."""

    ia: int
    ic: int
    grid_A: float
    grid_C_mid: float
    A: float
    B: float
    C_mid: float
    sse: float


def _best_on_grid(
    c: np.ndarray, v: np.ndarray, r0: float, a_grid: np.ndarray, cmid_grid: np.ndarray, polish_optimum: bool
) -> _GridBest:
    """Search the (A, C_mid) grid for the least squares cell, refine its B, then polish if asked."""
    b_cells, sse_cells = fit_b_grid(np.log(c), v, r0, a_grid, cmid_grid)
    ia, ic = np.unravel_index(int(np.argmin(sse_cells)), sse_cells.shape)
    grid_A, grid_C_mid = float(a_grid[ia]), float(cmid_grid[ic])
    B, sse = _refine_b(c, v, grid_A, grid_C_mid, r0, float(b_cells[ia, ic]), float(sse_cells[ia, ic]))
    A, C_mid = grid_A, grid_C_mid
    if polish_optimum:
        pA, pB, pC, p_sse = polish(
            c, v, r0, A, B, C_mid, (a_grid.min(), a_grid.max()), (cmid_grid.min(), cmid_grid.max())
        )
        if p_sse <= sse:
            A, B, C_mid, sse = pA, pB, pC, p_sse
    return _GridBest(ia, ic, grid_A, grid_C_mid, A, B, C_mid, sse)


def _fit_notes(a_grid: np.ndarray, cmid_grid: np.ndarray, best: _GridBest) -> list[str]:
    """The fit's warnings: an optimum on a grid edge, and B on a bound of its range."""
    notes = edge_warnings(a_grid, cmid_grid, best.ia, best.ic)
    if b_on_bound(best.B):
        notes.append(
            f"B = {best.B:.3g} is at a bound of its range {B_BOUNDS}: the best curve is {_bound_shape(best.B)}, not a"
            " sigmoid; its shape is not identified by these points (more evaluations across the rise)"
        )
    return notes


def fit_sigmoid(
    compute,
    value,
    *,
    r0: float | None = None,
    exclude_below: float | None = None,
    fit_upto: float | None = None,
    a_grid=None,
    cmid_grid=None,
    runs=None,
    polish_optimum: bool = True,
) -> SigmoidFit:
    """Fit the ScaleRL sigmoid to one curve: ``SigmoidModel(...).fit(compute, value, runs).result_``
    (the settings are ``SigmoidModel``'s)."""
    model = SigmoidModel(
        r0=r0,
        exclude_below=exclude_below,
        fit_upto=fit_upto,
        a_grid=a_grid,
        cmid_grid=cmid_grid,
        polish_optimum=polish_optimum,
    )
    return model.fit(compute, value, runs=runs).result_


def run_labels(runs, n: int) -> np.ndarray:
    """Integer codes for the run label of each point (every model's ``fit`` reads ``runs`` with it)."""
    labels = np.asarray(runs).ravel()
    if len(labels) != n:
        raise FitError(f"runs has {len(labels)} labels but there are {n} points")
    return np.unique(labels.astype(str), return_inverse=True)[1]


def _refine_b(c, v, A, C_mid, r0, B, sse) -> tuple[float, float]:
    """Polish the winning cell's B with ``curve_fit``; keep the grid value if that is no better."""
    from scipy.optimize import curve_fit  # here: runners' commands that never fit start ~0.1 s sooner

    try:
        (b_ref,), _ = curve_fit(lambda x, b: sigmoid(x, A, b, C_mid, r0), c, v, p0=[B])
    except (RuntimeError, ValueError):
        return B, sse
    sse_ref = float(np.sum((sigmoid(c, A, b_ref, C_mid, r0) - v) ** 2))
    if B_BOUNDS[0] <= b_ref <= B_BOUNDS[1] and sse_ref <= sse:  # unbounded curve_fit can leave the range
        return float(b_ref), sse_ref
    return B, sse

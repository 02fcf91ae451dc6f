"""A size's own runs against a forecast of them (``against_actual``): the share of its mean curve's
evaluations inside the band and, with several builds, of each build's mean curve inside one build's band,
the error of the forecast's median, and, once its runs have ended, its own A against the forecast's A and
interval. The band is any ``Band``: the draws of a forecast just made (``forecast``), or the band of one
committed before the size ran (``judge``)."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from scalefit.errors import FitError
from scalefit.sizes.data import FINISHED_AT, SizeData, reach_text
from scalefit.sizes.fits import SizeFit, fit_size


class Band(Protocol):
    def __call__(
        self, compute: np.ndarray, n_runs: np.ndarray | float = 1, builds: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Where a mean of ``n_runs`` evaluations at each compute lies (lo, hi), of a mean over ``builds``
        builds (None: the forecast size's own number; 1: one build)."""
        ...


def against_actual(
    band: Band,
    name: str,
    own: SizeData,
    curve: tuple[np.ndarray, np.ndarray],
    a: float,
    a_interval: tuple[float, float],
    a_grid,
    seed: int = 0,
    own_fit: SizeFit | None = None,
    reached: float = 1.0,
    upto: float = np.inf,
) -> tuple[dict[str, Any], SizeFit | None]:
    """The size's own runs against its forecast (``curve``: the forecast's compute grid and median): its own
    A (fitted on its runs; with several builds, their mean), the error, whether the interval holds it, the
    share of its mean curve's evaluations inside the band and, with several builds, of each build's mean
    curve inside the band of one build; and its fit. Runs that reach less than ``FINISHED_AT`` of the other
    sizes' compute (``reached``) are compared so far: the band's coverage of their evaluations, and no A,
    which a fit of part of a curve would only extrapolate (results/scale-gpu3: large at 37% gave 0.706).
    The curves are compared where every run has reached (to the shortest run's end; a run with nothing past
    compute 0 left out) and up to ``upto`` (the forecast's last compute): past it a mean would average fewer
    runs, a different set at each compute. A is fitted on all of them."""
    whole, own = own, own.compared(upto)
    c, v, k = own.mean_curve()
    lo, hi = band(c, k)
    rl = c > 0
    inside = (v >= lo) & (v <= hi)
    out: dict[str, Any] = {
        "points": int(rl.sum()),
        "band_coverage": float(inside[rl].mean()) if rl.any() else float("nan"),
        "rmse": float(np.sqrt(np.mean((np.interp(c[rl], *curve) - v[rl]) ** 2))) if rl.any() else None,
        "compute_reached": reached,
        "finished": reached >= FINISHED_AT,
    }
    if own.n_builds >= 2:
        by_build = {}
        for b, sub in own.by_build().items():
            cb, vb, kb = sub.mean_curve()
            lo_b, hi_b = band(cb, kb, builds=1)
            if (cb > 0).any():
                by_build[b] = float(((vb >= lo_b) & (vb <= hi_b))[cb > 0].mean())
        out.update(band_coverage_by_build=by_build, band_coverage_builds_mean=float(np.mean(list(by_build.values()))))
    if reached < FINISHED_AT:
        note = f"its runs reach {reach_text(reached)} of the other sizes' compute: its A is not measured until they end"
        out.update(A=None, A_error=None, A_inside=None, note=note)
        return out, None
    try:
        own_fit = own_fit or fit_size(name, whole, a_grid=a_grid, seed=seed)
    except FitError as e:
        out.update(A=None, A_error=None, A_inside=None, note=str(e))
        return out, None
    own_a = own_fit.theta["A"]
    out.update(A=own_a, A_error=a - own_a, A_inside=bool(a_interval[0] <= own_a <= a_interval[1]))
    return out, own_fit

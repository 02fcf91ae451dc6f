"""Slower or lower: whether an arm differs from the baseline in its ceiling (A), in its efficiency
(C_mid, B: the compute it takes to reach a level), or in a way its data cannot yet tell apart.

The ScaleRL paper's warning: a change that only slows learning (a learning rate halved) trails the
baseline early and ends level with it; read at half the budget it looks like a lower ceiling. From
curves that have not passed their knee, A and (C_mid, B) trade off, and the fit picks one reading.

- ``knee_from_data``: has a curve passed its knee, from the data alone (the slope of the runs'
  values against log C over the last doubling of compute against the doubling before it, or over
  the last two thirds of the fitted range when it spans less than 8x; a sigmoid in log C steepens
  until C_mid, then flattens), or a plateau (rising over its last doubling by under a tenth of the
  gain it has made since R0, and not steepening beyond noise). It does not use the fitted C_mid it
  is meant to check; over 8x or more of compute its slopes read the end of the data only, so where
  the first evaluation sits does not move them.
- ``separate``: from two forecasts' parameter draws, the ceiling difference ΔA, the efficiency ratio
  (the compute the variant needs to reach the share of its own gain that the baseline reaches at
  a budget, over the baseline's: C_mid and B, not A), the difference at the budget under the
  *same-ceiling* reading (the variant's A replaced by the baseline's), and the compute at which a
  variant only slower would have caught up.

Forecasts are read through their public members only (``fit``, ``samples``, ``level``), so the
single-variant and the joint campaign forecast serve alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from scalefit.forecasts.uncertainty import central_percentiles, interval_holding
from scalefit.ladder import against

KNEE_Z = 1.0  # decelerating by this many standard errors counts as past the knee
KNEE_WINDOW = float(np.log(2.0))  # the knee test's windows in log C: at most one doubling of compute each
# a curve rising by less than this share of the gain it has made, over its last doubling, is on its
# plateau: past its knee (a sigmoid in log C, B 2, from 3.6x C_mid on; one not yet risen is not flat)
FLAT_SHARE = 0.1
SEPARATION_REACH = 1000.0  # the furthest multiple of the budget a separating compute is looked for at
LEVEL_SHARE = 0.9  # an efficiency is read at most this far from R0 to the lower of the two ceilings
LATER_FACTOR = 1.25  # an efficiency ratio beyond this (or below its inverse) is called slower (faster)


@dataclass(frozen=True)
class Knee:
    """The knee test from the data: slopes of value against ln C over the last window of the fitted
    range and the window before it (``knee_from_data``), each the mean of the runs' own slopes, with
    its standard error. ``slope_middle`` is the earlier window's."""

    slope_middle: float
    slope_last: float
    se: float  # standard error of slope_last - slope_middle
    runs: int
    gain: float = 0.0  # the runs' mean over the last window less the level before training (R0, else
    # the mean at zero compute, else over the first window as wide)
    se_spread: float = np.inf  # the runs' spread alone (one run: its own scatter), without the floor

    @property
    def flat(self) -> bool:
        """Rising over the last doubling by less than ``FLAT_SHARE`` of the gain made, and not
        steepening beyond noise: a plateau. A curve that rose before its first evaluation and then
        rises again, steeper, is not one, however small its rise beside that early gain. Steepening is
        judged by the smaller of the two standard errors, so the floor that keeps noise from reading as
        a knee never lets a steepening pass for a plateau: both doubts fall on "not past its knee"."""
        steepening = self.slope_last > self.slope_middle + KNEE_Z * min(self.se, self.se_spread)
        return bool(self.gain > 0 and self.slope_last * KNEE_WINDOW < FLAT_SHARE * self.gain and not steepening)

    @property
    def passed(self) -> bool:
        """Flattening beyond noise, or flat: the data show the knee, whatever a fit says."""
        return bool(self.slope_last < self.slope_middle - KNEE_Z * self.se or self.flat)

    def text(self) -> str:
        if self.flat:
            state = "past its knee (flat)"
        else:
            still = "slowing, within noise" if self.slope_last < self.slope_middle else "still rising as fast or faster"
            state = "past its knee" if self.passed else f"not past its knee ({still})"
        return (
            f"{state} by the data: slope {self.slope_last:.3f} per e-fold of compute over the last window"
            f" of its data, {self.slope_middle:.3f} over the window before"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "slope_middle": self.slope_middle,
            "slope_last": self.slope_last,
            "se": self.se,
            "gain": self.gain,
            "runs": self.runs,
        }


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.polyfit(x, y, 1)[0]) if len(x) >= 2 and np.ptp(x) > 0 else np.nan


def knee_from_data(compute, value, runs=None, start: float | None = None) -> Knee | None:
    """The knee test on fitted points (``runs``: each point's run label; one run when omitted): the
    last two windows of the range in log C, each one doubling of compute (``KNEE_WINDOW``) or a third
    of the range where it spans less than three doublings. The gain is counted from ``start``, the
    level before any training (a fit's R0), else from the points at zero compute, else from the
    first window; zero compute is left out of the slopes (no log). The standard error of the change
    of slope is the runs' spread, floored by each run's own scatter about its two windows' lines
    (the only one for a single run). None with fewer than two points in a window of every run."""
    c, y = np.asarray(compute, float), np.asarray(value, float)
    r = np.zeros(len(c), int) if runs is None else np.asarray(runs)
    keep = c > 0
    if start is None and (~keep).any():
        start = float(y[~keep].mean())
    c, y, r = c[keep], y[keep], r[keep]
    if len(c) < 4:
        return None
    x = np.log(c)
    lo, hi = x.min(), x.max()
    width = min((hi - lo) / 3, KNEE_WINDOW)
    earlier = (x >= hi - 2 * width) & (x < hi - width)
    last = x >= hi - width
    pairs, scatter = [], []
    for run in np.unique(r):
        m = r == run
        s_mid, s_last = _slope(x[m & earlier], y[m & earlier]), _slope(x[m & last], y[m & last])
        if np.isfinite(s_mid) and np.isfinite(s_last):
            pairs.append((s_mid, s_last))
            scatter.append(_one_run_se(x[m], y[m], earlier[m], last[m]))
    if not pairs:
        return None
    mids, lasts = np.array(pairs).T
    own = [v for v in scatter if np.isfinite(v)]  # each run's scatter about its windows' lines
    se = spread = float(np.sqrt(np.mean(np.square(own)) / len(pairs))) if own else np.inf
    if len(pairs) >= 2:  # the runs' spread, floored by their own scatter: two runs' spread has one
        # degree of freedom, and runs that happen to agree would make any wiggle "beyond noise"
        spread = float(np.std(lasts - mids, ddof=1) / np.sqrt(len(pairs)))
        se = max(spread, se if own else 0.0)
    gain = float(y[last].mean() - (y[x <= lo + width].mean() if start is None else start))
    return Knee(float(mids.mean()), float(lasts.mean()), se, len(pairs), gain, spread)


def _one_run_se(x: np.ndarray, y: np.ndarray, *thirds: np.ndarray) -> float:
    """Standard error of the difference of two OLS slopes, each over one window of one run."""
    var = 0.0
    for m in thirds:
        xs, ys = x[m], y[m]
        if len(xs) < 3:
            return np.inf
        resid = ys - np.polyval(np.polyfit(xs, ys, 1), xs)
        var += float(np.sum(resid**2) / (len(xs) - 2) / np.sum((xs - xs.mean()) ** 2))
    return float(np.sqrt(var))


@dataclass(frozen=True)
class Separation:
    """A variant against the baseline: its ceiling, its efficiency, and what the data cannot tell."""

    delta_a: float  # variant A - baseline A (point fits)
    delta_a_interval: tuple[float, float]
    ceiling_open: bool  # either A interval reaches its grid's edge: the ceiling is not bounded
    share: float  # the share of its gain the efficiency is read at (``_share``)
    later: float  # compute the variant needs to reach ``share`` of its gain, over what the baseline needs
    later_interval: tuple[float, float]  # inf: not within reach
    same_ceiling_delta: float  # the difference at the budget if the variant had the baseline's ceiling
    same_ceiling_interval: tuple[float, float]
    separating_compute: float | None  # where a variant only slower would come within margin/2 of the baseline
    margin: float
    budget: float  # where the variant was compared

    @property
    def ceiling(self) -> str:
        """lower | higher | same | cannot tell"""
        side = None if self.ceiling_open else against(*self.delta_a_interval, -self.margin, self.margin)
        return {"below": "lower", "above": "higher", "within": "same"}.get(side, "cannot tell")

    @property
    def efficiency(self) -> str:
        """slower | faster | same | cannot tell (by the compute to reach ``share`` of its own gain,
        against the baseline's: C_mid and B, not A)"""
        side = against(*self.later_interval, 1 / LATER_FACTOR, LATER_FACTOR)
        return {"below": "faster", "above": "slower", "within": "same"}.get(side, "cannot tell")

    @property
    def label(self) -> str:
        """The reading in a few words: lower | higher (the ceiling differs), slower | faster (the
        same ceiling, reached later or sooner), same, or what is not yet told."""
        if self.ceiling in ("lower", "higher"):
            return self.ceiling
        if self.ceiling == "same":
            return {"cannot tell": "same ceiling, speed not yet told"}.get(self.efficiency, self.efficiency)
        if self.efficiency in ("slower", "faster"):
            return f"{self.efficiency}, ceiling not yet told"
        return "cannot tell yet"

    def text(self) -> str:
        """One line a user reads: which of ceiling and efficiency differ."""
        lo, hi = self.delta_a_interval
        ceiling = {
            "lower": f"lower ceiling (ΔA {self.delta_a:+.3f} [{lo:+.3f}, {hi:+.3f}])",
            "higher": f"higher ceiling (ΔA {self.delta_a:+.3f} [{lo:+.3f}, {hi:+.3f}])",
            "same": f"same ceiling (ΔA {self.delta_a:+.3f} [{lo:+.3f}, {hi:+.3f}])",
            "cannot tell": f"ceiling not yet told (ΔA {self.delta_a:+.3f} [{lo:+.3f}, {hi:+.3f}]"
            + (", unbounded)" if self.ceiling_open else ")"),
        }[self.ceiling]
        return f"{ceiling}; {self.efficiency_text()}"

    def efficiency_text(self) -> str:
        lo, hi = self.later_interval
        span = f"[{_times(lo)}, {_times(hi)}]"
        at = f"reaches {self.share:.0%} of its gain"
        if not np.isfinite(self.later):
            return f"{at} at no compute within reach {span}"
        return f"{at} at {self.later:.2g}× the baseline's compute {span}"

    def separation_text(self) -> str:
        """The compute at which slower and lower part (``separating_compute``), in words."""
        c, budget = self.separating_compute, self.budget
        if c is None and abs(self.delta_a) <= self.margin:
            return f"as fitted, the ceilings lie within ±{self.margin:g} (slower, not lower)"
        if c is None:
            return f"no compute within {SEPARATION_REACH:g}× the budget separates slower from lower"
        if c <= budget * 1.01:
            return "the budget itself separates slower from lower"
        return f"compute {c:.3g} ({c / budget:.2g}× the budget) would separate slower from lower"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ceiling": self.ceiling,
            "efficiency": self.efficiency,
            "delta_A": self.delta_a,
            "delta_A_interval": list(self.delta_a_interval),
            "ceiling_open": self.ceiling_open,
            "later": self.later,
            "later_interval": list(self.later_interval),
            "same_ceiling_delta": self.same_ceiling_delta,
            "same_ceiling_interval": list(self.same_ceiling_interval),
            "separating_compute": self.separating_compute,
            "label": self.label,
        }


def _times(x: float) -> str:
    return "∞" if not np.isfinite(x) else f"{x:.2g}×"


def _params(fc) -> np.ndarray:
    """The forecast's draws, in its fit's declared order (``fit.sample_names``)."""
    return fc.samples


def _point(fc) -> np.ndarray:
    """The fitted parameters as one row of draws."""
    return fc.fit.parameters.values[None, :]


def _share(fit, b: np.ndarray, bb: float) -> np.ndarray:
    """The share of its gain (from its level at zero compute to its ceiling) the baseline reaches at its
    budget, at most ``LEVEL_SHARE`` (near a plateau the compute to reach a share turns on a hair's
    difference of the ceiling, not on speed)."""
    start = fit.predict_batch(b, np.array([0.0]))[:, 0]
    top = b[:, _ceiling(fit)]
    return np.minimum((fit.predict_batch(b, np.array([bb]))[:, 0] - start) / (top - start), LEVEL_SHARE)


def _ceiling(fit) -> int:
    """The column of the fit's ceiling in its draws."""
    return fit.sample_names.index(fit.parameters.ceiling)


def _a_open(fc) -> bool:
    ceiling = fc.fit.parameters[fc.fit.parameters.ceiling]
    lo, hi = fc.interval(ceiling.name)
    return bool(lo <= ceiling.min + 1e-9 or hi >= ceiling.max - 1e-9)


def separate(
    variant, baseline, budget: float, baseline_budget: float | None = None, *, margin: float
) -> Separation | None:
    """Ceiling against efficiency, from two sigmoid forecasts' draws (paired row by row where they
    come from one simulated campaign). ``budget``: where the variant is compared; the baseline at
    ``baseline_budget`` (default the same). None where no pair of draws is finite: nothing to read."""
    bb = budget if baseline_budget is None else baseline_budget
    level = variant.level
    fv, fb = variant.fit, baseline.fit
    v, b = _params(variant), _params(baseline)
    n = min(len(v), len(b))
    ok = np.isfinite(v[:n]).all(axis=1) & np.isfinite(b[:n]).all(axis=1)  # pairs where both refits held
    v, b = v[:n][ok], b[:n][ok]
    if not len(v):
        return None
    pv, pb = _point(variant), _point(baseline)
    q = central_percentiles(level)
    iv, ib = _ceiling(fv), _ceiling(fb)

    da = v[:, iv] - b[:, ib]
    da_point = float(pv[0, iv] - pb[0, ib])
    da_lo, da_hi = interval_holding(da, da_point, level)

    share = _share(fb, b, bb)
    with np.errstate(divide="ignore", invalid="ignore"):
        later = fv.compute_at_share(v, share) / fb.compute_at_share(b, share)
    q_point = _share(fb, pb, bb)
    later_point = float(fv.compute_at_share(pv, q_point)[0] / fb.compute_at_share(pb, q_point)[0])
    later = np.where(np.isnan(later), np.inf, later)
    l_lo, l_hi = (float(x) for x in np.percentile(later, q))  # inf draws sort last: an open upper end
    l_lo, l_hi = min(l_lo, later_point), max(l_hi, later_point)

    same = v.copy()
    same[:, iv] = b[:, ib]
    ds = fv.predict_batch(same, np.array([budget]))[:, 0] - fb.predict_batch(b, np.array([bb]))[:, 0]
    same_point = pv.copy()
    same_point[:, iv] = pb[:, ib]
    ds_point = float(
        fv.predict_batch(same_point, np.array([budget]))[0, 0] - fb.predict_batch(pb, np.array([bb]))[0, 0]
    )
    ds_lo, ds_hi = interval_holding(ds, ds_point, level)

    return Separation(
        delta_a=da_point,
        delta_a_interval=(da_lo, da_hi),
        ceiling_open=_a_open(variant) or _a_open(baseline),
        share=float(q_point[0]),
        later=later_point,
        later_interval=(l_lo, l_hi),
        same_ceiling_delta=ds_point,
        same_ceiling_interval=(ds_lo, ds_hi),
        separating_compute=separating_compute(pv, pb, budget, margin, (fv, fb)),
        margin=margin,
        budget=budget,
    )


def separating_compute(pv: np.ndarray, pb: np.ndarray, budget: float, margin: float, fits) -> float | None:
    """The least compute from ``budget`` on at which the variant (parameters ``pv``, a row in its fit's
    declared order; ``fits``: the variant's and the baseline's fits, whose curves and declarations
    are read), read as only slower (the baseline's ceiling, its own efficiency), comes within half
    the margin of the baseline (``pb``): measured there, a slower variant reads "no difference" and a
    lower one stays ``|ΔA|`` below. None where the fitted ceilings lie within the margin (nothing to
    separate) or the readings meet only past ``SEPARATION_REACH`` budgets."""
    fv, fb = fits
    iv, ib = _ceiling(fv), _ceiling(fb)
    if abs(float(pv[0, iv] - pb[0, ib])) <= margin:
        return None
    same = pv.copy()
    same[:, iv] = pb[:, ib]
    c = budget * np.geomspace(1.0, SEPARATION_REACH, 400)
    gap = np.abs(fv.predict_batch(same, c)[0] - fb.predict_batch(pb, c)[0])
    hit = np.flatnonzero(gap <= margin / 2)
    return float(c[hit[0]]) if len(hit) else None

"""The leave-one-size-out backtest (``backtest_sizes``): each fitted size forecast from all the others by
the same procedure as any size (``forecast_size``, the forms chosen again without it), read as any forecast
is (its ``interval``, its ``Verdict``) and scored against its own runs: the band's coverage of its
evaluations and A inside its interval, and its A's error beside a plain rule's: the nearest size's A (in
log N, among sizes whose runs have ended) taken for its own, which laws that generalise should beat."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from scalefit.sizes.data import FINISHED_AT, SizeData, compute_reached
from scalefit.sizes.fits import A_GRID, SizeFit, fit_size
from scalefit.sizes.forecast import forecast_size
from scalefit.sizes.laws import MIN_SIZES


@dataclass
class SizesBacktest:
    """Each size forecast from all the others (those with enough on both sides), and the coverage."""

    rows: pd.DataFrame
    level: float

    @property
    def coverage(self) -> float:
        """Share of every forecast size's mean-curve evaluations inside its band."""
        r = self.rows
        return float((r["band_coverage"] * r["points"]).sum() / r["points"].sum()) if len(r) else float("nan")

    @property
    def a_hits(self) -> tuple[int, int]:
        r = self.rows.dropna(subset=["A_inside"])
        return int(r["A_inside"].astype(bool).sum()), len(r)

    def a_rmse(self) -> tuple[float, float]:
        """A's RMS error over the folds: the laws', and the plain rule's (the nearest size's A for its own)."""
        r = self.rows.dropna(subset=["A", "A_nearest"])
        if not len(r):
            return float("nan"), float("nan")
        laws, plain = r["A_forecast"] - r["A"], r["A_nearest"] - r["A"]
        return float(np.sqrt(np.mean(laws**2))), float(np.sqrt(np.mean(plain**2)))

    def lines(self) -> list[str]:
        hit, n = self.a_hits
        out = [
            f"leave-one-size-out backtest: {len(self.rows)} size(s) forecast from the others; "
            f"{self.level:.0%} band holds {self.coverage:.0%} of their evaluations; A inside its interval {hit}/{n}"
        ]
        laws, plain = self.a_rmse()
        if np.isfinite(laws):
            out.append(
                f"  A's RMS error: the laws {laws:.3f}; the nearest size's A taken for its own {plain:.3f}"
                + ("" if laws < plain else " (the laws do not beat that plain rule)")
            )
        for r in self.rows.itertuples():
            a = "" if pd.isna(r.A) else f", A {r.A:.3f} vs {r.A_forecast:.3f} ({r.A_error:+.3f})"
            out.append(
                f"  {r.size:<10} band {r.band_coverage:.0%} of {r.points}{a}, laws {r.forms}"
                + ("" if r.predictable else "  [not predictable]")
            )
        return out


def backtest_sizes(
    data: Mapping[str, SizeData], fits: Mapping[str, SizeFit] | None = None, **kwargs: Any
) -> SizesBacktest:
    """Forecast each size from all the others (sizes with ``MIN_SIZES + 1`` others), as ``forecast_size`` does."""
    kw = {k: v for k, v in kwargs.items() if k in ("level", "tolerance", "n_draws", "a_grid", "seed")}
    a_grid, seed = kw.get("a_grid", A_GRID), kw.get("seed", 0)
    fits = {k: (fits or {}).get(k) or fit_size(k, d, a_grid=a_grid, seed=seed) for k, d in data.items()}
    ended = [k for k in data if compute_reached(data, k) >= FINISHED_AT]  # the plain rule's candidates
    rows = []
    for name in data:
        if len(data) - 1 < MIN_SIZES + 1:
            break
        fc = forecast_size(data, name, fits=fits, **kw)
        act = fc.actual or {}
        others = [k for k in ended if k != name] or [k for k in data if k != name]
        nearest = min(others, key=lambda k: abs(np.log(data[k].params / data[name].params)))
        a_lo, a_hi = fc.interval("A")
        rows.append(
            {
                "size": name,
                "parameters": fc.params,
                "A_forecast": fc.A,
                "A_lo": a_lo,
                "A_hi": a_hi,
                "A": act.get("A"),
                "A_error": act.get("A_error"),
                "A_inside": act.get("A_inside"),
                "A_nearest": fits[nearest].theta["A"],
                "band_coverage": act.get("band_coverage"),
                "points": act.get("points", 0),
                "rmse": act.get("rmse"),
                "predictable": fc.verdict.predictable,
                "forms": fc.choice.label,
            }
        )
    return SizesBacktest(pd.DataFrame(rows), kwargs.get("level", 0.9))

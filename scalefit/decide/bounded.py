"""Worse, bounded from the data: a call for an arm that no curve describes.

A variant with no fit (flat or decreasing: no sigmoid gain to identify) or no band gets no call from
the fits. Its data can still rule it out. Over the compute still to come (``doublings`` of it), no
arm can be expected to rise more than the campaign has shown any arm rise in one doubling, so a
variant whose measured difference from the baseline lies below the baseline by more than that rise
(times the doublings, plus the margin) across its whole interval is **worse** at the budget. Only
"worse": the bound holds the variant's rise, not a fall, and an arm that leads early may still
collapse (the off-policy arms of loo-gpu and loo-gpu2 led at half their budgets and fell), so no
"better" is ever bounded this way. At the budget itself (no doubling left) it is the measured
interval's call. Numbers only: the levels and intervals come from the caller's curves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


def mean_level(runs: Sequence[tuple[np.ndarray, np.ndarray]], at: float) -> float:
    """The mean over runs (each (compute, value), compute rising) of each run's value interpolated at ``at``."""
    return float(np.mean([np.interp(at, c, v) for c, v in runs]))


def largest_rise(arms: Mapping[str, Sequence[tuple[np.ndarray, np.ndarray]]], upto: Mapping[str, float]) -> float:
    """The largest rise of any arm's mean level over one doubling of compute, c/2 to c, over every
    evaluation c of the arm up to ``upto[arm]`` whose half lies at or past the arm's first evaluation
    with compute > 0 (the first doubling from zero is unbounded); 0 where no arm has such a doubling."""
    best = 0.0
    for arm, runs in arms.items():
        cs = np.unique(np.concatenate([c for c, _ in runs]))
        cs = cs[cs > 0]
        if not len(cs) or arm not in upto:
            continue
        for c in cs[(cs <= upto[arm] * (1 + 1e-9)) & (cs / 2 >= cs[0] * (1 - 1e-9))]:
            best = max(best, mean_level(runs, c) - mean_level(runs, c / 2))
    return best


@dataclass(frozen=True)
class Bound:
    """A measured difference (variant - baseline, with its interval) at ``at``, and the most the
    variant could still gain on the baseline by the budget: ``rise`` per doubling times ``doublings``."""

    delta: float
    lo: float
    hi: float
    rise: float
    doublings: float

    @property
    def reach(self) -> float:
        """The interval's top moved up by every rise still to come."""
        return self.hi + self.rise * self.doublings

    def worse(self, margin: float) -> bool:
        return bool(np.isfinite(self.reach) and self.reach < -margin)

    def short(self) -> str:
        """The call's reason in a few words (the terminal summary's)."""
        return "bounded by its data"

    def text(self, margin: float, last_k: int = 1) -> str:
        """e.g. "worse (bounded from the data): Δ -0.221 [-0.239, -0.203] measured at half the budget;
        no arm rose more than 0.153 in one doubling, so at most -0.050 by the budget, below -0.02";
        ``last_k`` > 1: the difference is of the seeds' last-``last_k`` means."""
        where = {0: "at the budget", 1: "at half the budget"}.get(
            self.doublings, f"{self.doublings:.2g} doublings before it"
        )
        what = f" (last {last_k})" if last_k > 1 else ""
        up = (
            f"; no arm rose more than {self.rise:.3f} in one doubling, so at most {self.reach:+.3f} by the budget"
            if self.doublings
            else ""
        )
        return (
            f"worse (bounded from the data): Δ{what} {self.delta:+.3f} [{self.lo:+.3f}, {self.hi:+.3f}] measured "
            f"{where}{up}, below -{margin:g}"
        )


def doublings(at: float, budget: float) -> float:
    """How many doublings of compute lie from ``at`` to ``budget`` (0 where ``at`` is the budget)."""
    return max(math.log2(budget / at), 0.0) if at > 0 else math.inf

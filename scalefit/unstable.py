"""Unstable runs: evaluations where one seed leaves its sibling seeds by a robust margin.

At each evaluation (step) of a variant with at least ``MIN_SEEDS`` seeds there, a run's value is
compared with the median of its siblings (the other seeds) and scaled by the median absolute
deviation of all the seeds there, floored at the campaign's typical such deviation (identical
seeds at one step do not flag everything). Beyond ``THRESHOLD`` the evaluation is flagged. A
collapse is part of a recipe's behaviour: flags are reported (``Flag.text``, ``arm_counts``) and
kept out of the seed-noise estimate (``scalefit.seeds``), never dropped from the curves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

THRESHOLD = 5.0  # |value - siblings' median| / max(the step's MAD as an sd, the campaign's typical one)
MIN_SEEDS = 3  # a median and a MAD need at least three seeds at the step


MAD_SD = 1.4826  # a median absolute deviation times this estimates a normal sd


def _sibling_medians(col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indices evaluated, each one's siblings' median) of one step's values (NaN: not evaluated)."""
    ok = np.flatnonzero(np.isfinite(col))
    if len(ok) < MIN_SEEDS:
        return ok, np.full(len(ok), np.nan)
    return ok, np.array([float(np.median(col[ok[ok != i]])) for i in ok])


def typical_scale(matrices: list[np.ndarray]) -> float:
    """The floor: the campaign's typical distance of a seed from its siblings' median at one step,
    as a robust sd (``MAD_SD`` x the median distance over every step of every variant with at
    least ``MIN_SEEDS`` seeds; each matrix runs x steps, NaN: not evaluated)."""
    dist = []
    for m in matrices:
        for col in m.T:
            ok, med = _sibling_medians(col)
            if len(ok) >= MIN_SEEDS:
                dist.append(np.abs(col[ok] - med))
    return MAD_SD * float(np.median(np.concatenate(dist))) if dist else 0.0


def scores(values: np.ndarray, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """(z, siblings' median) of each entry of ``values`` (runs x steps, NaN: not evaluated): its
    distance from the median of the other runs at its step over that step's MAD as an sd (at least
    ``floor``); z is NaN where the step has fewer than ``MIN_SEEDS`` runs."""
    z = np.full(values.shape, np.nan)
    med = np.full(values.shape, np.nan)
    for j, col in enumerate(values.T):
        ok, sib = _sibling_medians(col)
        if len(ok) < MIN_SEEDS:
            continue
        scale = max(MAD_SD * float(np.median(np.abs(col[ok] - np.median(col[ok])))), floor)
        med[ok, j] = sib
        z[ok, j] = (col[ok] - sib) / scale if scale > 0 else 0.0
    return z, med


def flagged(values: np.ndarray, floor: float) -> np.ndarray:
    """Boolean mask (runs x steps) of the evaluations beyond ``THRESHOLD``."""
    z, _ = scores(values, floor)
    return np.nan_to_num(np.abs(z), nan=0.0) > THRESHOLD


@dataclass
class Flag:
    """One run's flagged evaluations: where it left its siblings and whether it came back."""

    variant: str
    run: str  # the run's name (e.g. baseline/seed5)
    seed: int
    steps: list[int]
    values: list[float]
    siblings: list[float]  # the siblings' median at each flagged step
    recovered: bool  # its last evaluation is back among its siblings

    @property
    def collapsed(self) -> bool:
        """The worst flagged evaluation is below its siblings (a drop, not a jump)."""
        i = int(np.argmax(np.abs(np.subtract(self.values, self.siblings))))
        return self.values[i] < self.siblings[i]

    def text(self) -> str:
        """e.g. "baseline seed 5: dropped to 0.20 at step 240 (siblings 0.71), recovered"."""
        i = int(np.argmax(np.abs(np.subtract(self.values, self.siblings))))
        verb = "dropped" if self.values[i] < self.siblings[i] else "rose"
        more = len(self.steps) - 1
        also = f" and {more} more evaluation{'s' if more > 1 else ''}" if more else ""
        return (
            f"{self.variant} seed {self.seed}: {verb} to {self.values[i]:.2f} at step {self.steps[i]} "
            f"(siblings {self.siblings[i]:.2f}){also}, {'recovered' if self.recovered else 'did not recover'}"
        )


def flag_runs(curves: pd.DataFrame, value: str, step: str = "step") -> list[Flag]:
    """Every run of ``curves`` (columns variant, seed, run, ``step``, ``value``) with a flagged
    evaluation, the floor taken over the whole campaign."""
    tables = {
        v: g.pivot_table(index="seed", columns=step, values=value, aggfunc="mean")
        for v, g in curves.groupby("variant", sort=False)
    }
    floor = typical_scale([t.to_numpy(float) for t in tables.values()])
    names = curves.groupby(["variant", "seed"])["run"].first() if "run" in curves else None
    out = []
    for v, t in tables.items():
        m = t.to_numpy(float)
        z, med = scores(m, floor)
        hit = np.nan_to_num(np.abs(z), nan=0.0) > THRESHOLD
        for i in np.flatnonzero(hit.any(axis=1)):
            cols = np.flatnonzero(hit[i])
            last = int(np.flatnonzero(np.isfinite(m[i]))[-1])
            seed = int(t.index[i])
            out.append(
                Flag(
                    v,
                    str(names[(v, t.index[i])]) if names is not None else f"{v}/seed{seed}",
                    seed,
                    [int(t.columns[j]) for j in cols],
                    [float(m[i, j]) for j in cols],
                    [float(med[i, j]) for j in cols],
                    recovered=not hit[i, last],
                )
            )
    return out


def arm_counts(curves: pd.DataFrame, flags: list[Flag]) -> dict[str, str]:
    """Per variant with a flag: "2 of 8 runs collapsed" (and how many rose above their siblings)."""
    out = {}
    for v, g in curves.groupby("variant", sort=False):
        mine = [f for f in flags if f.variant == v]
        if not mine:
            continue
        n = g["seed"].nunique()
        down = sum(f.collapsed for f in mine)
        parts = [f"{down} of {n} runs collapsed"] if down else []
        if len(mine) - down:
            parts.append(f"{len(mine) - down} of {n} rose above their siblings")
        out[v] = ", ".join(parts)
    return out

"""Unstable runs: a seed that collapses below its sibling seeds, told from seeds that merely spread.

A collapse is a fall, never a rise: only evaluations *below* the siblings are ever flagged, and an
upward departure is never dropped. At each evaluation (step) a run's deviation from the median of
its siblings (the other seeds there) is scaled by its variant's own robust seed spread: the
median absolute deviation of every such deviation over all its steps, as an sd (``variant_scale``;
steps where every seed is identical, such as the base model's, left out), floored at
``FLOOR_SHARE`` of the campaign's typical arm's (``typical_scale``). An evaluation is flagged on
persistence or size, never on one moderate dip:

- **persistent**: ``PERSIST_Z`` or more scaled units below its siblings at ``PERSIST_RUN`` or more
  consecutive evaluations (each of them flagged), where the variant has ``MIN_SEEDS`` seeds;
- **large**: ``SINGLE_Z`` or more units below, once, where the variant has ``MIN_SEEDS`` seeds;
- **far below any healthy spread** (two seeds or more, where a collapse widens the variant's own
  scale or there is none): more than ``DROP`` below its siblings' median at ``PERSIST_RUN`` or more
  consecutive evaluations, having fallen more than ``DROP`` from its own best earlier evaluation
  (it fell, rather than never rose); or once more than ``2 * DROP`` below, after such a fall. The
  recorded arms' robust seed sd runs 0.007-0.025 (the two unstable off-policy arms': 0.05-0.06).

The thresholds hold the false-flag rate of simulated healthy campaigns (each arm its own spread,
growing with compute; Gaussian and Student-t(3) noise) at or under 3% of studies
(``tests/bench_unstable.py``, part of ``make bench-predict``): the heavy tails set them. A collapse
is part of a recipe's behaviour: flags are reported (``Flag.text``, ``arm_counts``) and their
evaluations are left out of the fit, of the seed-noise estimate (``scalefit.forecasts.seeds``) and of the
target a forecast is scored on alike; they stay in the curves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

MIN_SEEDS = 3  # a median of siblings and a spread around it need at least three seeds at the step
PERSIST_Z = 8.0  # scaled units below the siblings' median, at PERSIST_RUN consecutive evaluations
PERSIST_RUN = 2
SINGLE_Z = 18.0  # scaled units below the siblings' median, at one evaluation
DROP = 0.15  # below the siblings' median and (half of it) below the run's own best earlier value
FLOOR_SHARE = 0.5  # a variant's scale is at least this share of the campaign's typical arm's
MAD_SD = 1.4826  # a median absolute deviation times this estimates a normal sd


def deviations(values: np.ndarray) -> np.ndarray:
    """Each entry of ``values`` (runs x steps, NaN: not evaluated) less the median of the other runs
    at its step; NaN where the step holds fewer than two runs."""
    out = np.full(values.shape, np.nan)
    n = len(values)
    two = np.isfinite(values).sum(axis=0) >= 2
    if n < 2 or not two.any():
        return out
    siblings = np.array([np.delete(np.arange(n), i) for i in range(n)])  # row i: every run but i
    others = values[siblings][:, :, two]  # (runs, runs - 1, steps): one median call for every run
    with np.errstate(all="ignore"):  # a step where only this run was evaluated: NaN, as it should be
        med = np.nanmedian(np.where(np.isfinite(others), others, np.nan), axis=1)
    out[:, two] = values[:, two] - med
    return out


def variant_scale(values: np.ndarray) -> float:
    """The variant's robust seed spread: ``MAD_SD`` x the median |deviation from the siblings' median|
    over every step with ``MIN_SEEDS`` runs whose runs are not all identical (0: none such)."""
    d = deviations(values)
    spread = np.nanmax(values, axis=0, initial=-np.inf) > np.nanmin(values, axis=0, initial=np.inf)
    steps = (np.isfinite(values).sum(axis=0) >= MIN_SEEDS) & spread
    dist = np.abs(d[:, steps])
    dist = dist[np.isfinite(dist)]
    return MAD_SD * float(np.median(dist)) if len(dist) else 0.0


def typical_scale(matrices: list[np.ndarray]) -> float:
    """The campaign's typical arm's seed spread: the median of its variants' ``variant_scale`` (those
    with ``MIN_SEEDS`` runs somewhere; 0: none)."""
    scales = [s for m in matrices if (s := variant_scale(m)) > 0]
    return float(np.median(scales)) if scales else 0.0


def _runs_of(mask: np.ndarray, length: int) -> np.ndarray:
    """The entries of a boolean row that lie in a run of ``length`` or more consecutive Trues."""
    out = np.zeros_like(mask)
    start = None
    for j, hit in enumerate([*mask, False]):
        if hit and start is None:
            start = j
        elif not hit and start is not None:
            if j - start >= length:
                out[start:j] = True
            start = None
    return out


def scores(values: np.ndarray, typical: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(z, siblings' median, scale) of a variant's ``values`` (runs x steps, NaN: not evaluated):
    each entry's deviation from its siblings' median over the variant's scale (``variant_scale``, at
    least ``FLOOR_SHARE`` x ``typical``); z is NaN where the step has fewer than ``MIN_SEEDS`` runs."""
    d = deviations(values)
    scale = max(variant_scale(values), FLOOR_SHARE * typical)
    enough = np.isfinite(values).sum(axis=0) >= MIN_SEEDS
    z = np.where(enough[None, :], d / scale, np.nan) if scale > 0 else np.full(values.shape, np.nan)
    return z, values - d, scale


def flagged(values: np.ndarray, typical: float) -> np.ndarray:
    """Boolean mask (runs x steps) of a variant's collapsed evaluations (the module's three rules)."""
    z, _, _ = scores(values, typical)
    d = deviations(values)
    below = np.nan_to_num(z, nan=0.0) <= -PERSIST_Z
    hit = np.array([_runs_of(row, PERSIST_RUN) for row in below]) if len(values) else below
    hit |= np.nan_to_num(z, nan=0.0) <= -SINGLE_Z
    best = np.fmax.accumulate(np.where(np.isfinite(values), values, -np.inf), axis=1)  # its best so far
    earlier = np.concatenate([np.full((len(values), 1), -np.inf), best[:, :-1]], axis=1)
    fell = np.nan_to_num(earlier - values, nan=0.0, neginf=0.0)
    gap = -np.nan_to_num(d, nan=0.0)
    for i in range(len(values)):  # a fall of DROP from its best that stays DROP below its siblings
        below = _runs_of(gap[i] > DROP, PERSIST_RUN)
        for run in np.split(np.flatnonzero(below), np.flatnonzero(np.diff(np.flatnonzero(below)) > 1) + 1):
            if len(run) and fell[i, run].max() > DROP:
                hit[i, run] = True
    hit |= (gap > 2 * DROP) & (fell > DROP)
    return hit


@dataclass
class Flag:
    """One run's flagged evaluations: where it fell below its siblings and whether it came back."""

    variant: str
    run: str  # the run's name (e.g. baseline/seed5)
    seed: int
    steps: list[int]
    values: list[float]
    siblings: list[float]  # the siblings' median at each flagged step
    recovered: bool  # its last evaluation is back among its siblings

    @property
    def collapsed(self) -> bool:
        """Every flag is a fall below the siblings (kept for the readers that count them)."""
        return True

    def text(self) -> str:
        """e.g. "baseline seed 5: dropped to 0.20 at step 240 (siblings 0.71), recovered"."""
        i = int(np.argmin(np.subtract(self.values, self.siblings)))
        more = len(self.steps) - 1
        also = f" and {more} more evaluation{'s' if more > 1 else ''}" if more else ""
        return (
            f"{self.variant} seed {self.seed}: dropped to {self.values[i]:.2f} at step {self.steps[i]} "
            f"(siblings {self.siblings[i]:.2f}){also}, {'recovered' if self.recovered else 'did not recover'}"
        )


def flag_runs(curves: pd.DataFrame, value: str, step: str = "step") -> list[Flag]:
    """Every run of ``curves`` (columns variant, seed, run, ``step``, ``value``) with a flagged
    evaluation, each variant on its own scale (floored by the campaign's typical arm's)."""
    tables = {
        v: g.pivot_table(index="seed", columns=step, values=value, aggfunc="mean")
        for v, g in curves.groupby("variant", sort=False)
    }
    typical = typical_scale([t.to_numpy(float) for t in tables.values()])
    names = curves.groupby(["variant", "seed"])["run"].first() if "run" in curves else None
    out = []
    for v, t in tables.items():
        m = t.to_numpy(float)
        hit = flagged(m, typical)
        med = m - deviations(m)
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
    """Per variant with a flag: "2 of 8 runs collapsed"."""
    out = {}
    for v, g in curves.groupby("variant", sort=False):
        mine = [f for f in flags if f.variant == v]
        if mine:
            out[v] = f"{len(mine)} of {g['seed'].nunique()} runs collapsed"
    return out

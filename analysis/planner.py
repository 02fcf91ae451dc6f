"""The seed planner: how much a campaign's seeds can resolve, and how many a decision needs.

From a campaign's recorded curves (MLflow or a published ``curves.csv``):

- the **seed spread**: the pooled standard deviation of one seed's value at the budget (and at
  half of it) around its variant's mean, df = Σ(seeds − 1), for the last evaluation and for the
  mean of the last k evaluations;
- the **evaluation noise**: the white part of a run's deviation (half the variance of successive
  differences of the seeds' deviations) and the part every run shares at one step;
- the **smallest resolvable difference** of each comparison (variant vs baseline with their seed
  counts): (z₁₋α/₂ + z_power) · sd · √(1/k_b + 1/k_v), two-sided α = 0.05, 80% power;
- the **seeds per arm** a target margin needs: 2 · ((z₁₋α/₂ + z_power) · sd / margin)², rounded up;
- **builds or seeds**: the sd of a level and of a difference for designs of B base-model builds × S
  seeds, √(σ_b²/B + σ_s²/(B·S)) and √(τ²/B + 2σ_s²/(B·S)), with σ_b (levels), τ (differences) between
  builds and σ_s within, from the curves where they hold several builds, else as measured in
  results/builds-gpu: where σ_b dominates, more seeds do not make a level a claim about the recipe.

Numbers only; ``python -m analysis plan`` prints them and the LOO table carries the resolvable
difference of each row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import norm

from analysis import builds
from runners.contract import MEAN_AT_16
from scalefit.defaults import DEFAULT_MARGIN
from scalefit.forecasts.settings import FitSettings

ALPHA = 0.05
POWER = 0.8
RESOLVABLE = ("resolvable", "resolvable_last_k", "resolvable_half", "resolvable_half_last_k")


def z_sum(alpha: float = ALPHA, power: float = POWER) -> float:
    """z_{1-alpha/2} + z_{power}: 2.80 at the defaults."""
    return float(norm.ppf(1 - alpha / 2) + norm.ppf(power))


def resolvable(sd: float, k_a: int, k_b: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest true difference of two seed means (k_a and k_b seeds) detected with ``power``."""
    return z_sum(alpha, power) * sd * math.sqrt(1.0 / k_a + 1.0 / k_b)


def seeds_per_arm(sd: float, margin: float, alpha: float = ALPHA, power: float = POWER) -> int:
    """Seeds per arm for a difference of ``margin`` to be detected with ``power``."""
    return max(2, math.ceil(2.0 * (z_sum(alpha, power) * sd / margin) ** 2))


def _seed_values(g: pd.DataFrame, x: str, where: float, last_k: int) -> pd.DataFrame:
    """Each seed's value at ``where`` (interpolated) and the mean of its last ``last_k`` evaluations
    at or before it."""
    rows = []
    for seed, gs in g.sort_values(x).groupby("seed"):
        xs, ys = gs[x].to_numpy(), gs[MEAN_AT_16].to_numpy()
        before = ys[xs <= where * (1 + 1e-9)]
        rows.append(
            {
                "seed": seed,
                "final": float(np.interp(where, xs, ys)),
                "last_k": float(before[-last_k:].mean()) if len(before) else np.nan,
            }
        )
    return pd.DataFrame(rows)


@dataclass
class PooledSeedSd:
    """Pooled seed-to-seed sd at one fraction of the budget."""

    fraction: float
    sd_final: float
    sd_last_k: float
    dof: int
    last_k: int

    def ci(self, which: str = "final", level: float = 0.95) -> tuple[float, float]:
        from scipy.stats import chi2

        sd = self.sd_final if which == "final" else self.sd_last_k
        if self.dof < 1 or not np.isfinite(sd):
            return np.nan, np.nan
        a = (1 - level) / 2
        return float(sd * math.sqrt(self.dof / chi2.ppf(1 - a, self.dof))), float(
            sd * math.sqrt(self.dof / chi2.ppf(a, self.dof))
        )


def pooled_seed_sd(curves: pd.DataFrame, x: str, fraction: float = 1.0, last_k: int = 3) -> PooledSeedSd:
    """Pooled sd of each seed around its variant's seed mean at ``fraction`` of the variant's budget
    (the smallest final compute of its seeds), over every variant with two seeds or more."""
    ss_f = ss_k = 0.0
    dof = 0
    for _, g in curves.groupby("variant", sort=False):
        if g["seed"].nunique() < 2:
            continue
        where = fraction * float(g.groupby("seed")[x].max().min())
        vals = _seed_values(g, x, where, last_k)
        ss_f += float(((vals["final"] - vals["final"].mean()) ** 2).sum())
        ss_k += float(((vals["last_k"] - vals["last_k"].mean()) ** 2).sum())
        dof += len(vals) - 1
    if not dof:
        return PooledSeedSd(fraction, np.nan, np.nan, 0, last_k)
    return PooledSeedSd(fraction, math.sqrt(ss_f / dof), math.sqrt(ss_k / dof), dof, last_k)


def evaluation_noise(curves: pd.DataFrame, x: str) -> dict[str, float]:
    """The white (evaluation) part of a run's deviation, and the part every run shares at one step.

    White: half the mean square of successive differences of the seeds' deviations from their
    variant's mean at each step (slow drift cancels in a difference). Shared: the mean product of
    two variants' seed-mean deviations from a smooth curve (a rolling median over 5 steps) at the
    same step — what one evaluation's prompts and seed do to every run at once.
    """
    white_sq, n_white = 0.0, 0
    resid: dict[str, pd.Series] = {}
    for v, g in curves.groupby("variant", sort=False):
        wide = g.pivot_table(index="step", columns="seed", values=MEAN_AT_16).dropna()
        if wide.shape[0] < 5:
            continue
        k = wide.shape[1]
        if k >= 2:
            dev = (wide.sub(wide.mean(axis=1), axis=0) * math.sqrt(k / (k - 1))).to_numpy()
            diff = np.diff(dev, axis=0)
            white_sq += float((diff**2).sum()) / 2.0
            n_white += diff.size
        mean = wide.mean(axis=1)
        resid[v] = (mean - mean.rolling(5, center=True, min_periods=3).median()).iloc[1:]
    products = []
    names = list(resid)
    for i, v in enumerate(names):
        for w in names[i + 1 :]:
            common = resid[v].index.intersection(resid[w].index)
            products += list(resid[v][common].to_numpy() * resid[w][common].to_numpy())
    return {
        "white": math.sqrt(white_sq / n_white) if n_white else np.nan,
        "shared": math.sqrt(max(float(np.mean(products)), 0.0)) if products else np.nan,
    }


@dataclass
class Plan:
    """What a campaign's seeds resolve, and the seeds a margin needs."""

    x: str
    margin: float
    last_k: int
    spread: dict[float, PooledSeedSd]  # fraction of the budget -> spread
    noise: dict[str, float]
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per comparison
    build_sd: dict[str, Any] = field(default_factory=dict)  # σ_b, τ, σ_s and where they come from (``build_spread``)

    def seeds_needed(self, fraction: float = 1.0) -> dict[str, int | None]:
        s = self.spread[fraction]
        return {
            "final": seeds_per_arm(s.sd_final, self.margin) if np.isfinite(s.sd_final) else None,
            f"last_{self.last_k}": seeds_per_arm(s.sd_last_k, self.margin) if np.isfinite(s.sd_last_k) else None,
        }

    def text(self) -> str:
        k = self.last_k
        out = [f"seed planner ({self.x}; two-sided α = {ALPHA}, power {POWER:.0%}, margin ±{self.margin:g})", ""]
        for frac, s in self.spread.items():
            where = "at the budget" if frac == 1.0 else f"at {frac:g} of the budget"
            if not s.dof:
                out.append(f"seed spread {where}: no variant has two seeds; nothing to pool")
                continue
            lo, hi = s.ci("final")
            out.append(
                f"seed spread {where}: sd {s.sd_final:.4f} of the last evaluation (95% CI {lo:.4f}–{hi:.4f}), "
                f"{s.sd_last_k:.4f} of the mean of the last {k} (df {s.dof})"
            )
        out.append(
            f"evaluation noise: {self.noise['white']:.4f} per evaluation (white part of a run's deviation), "
            f"{self.noise['shared']:.4f} shared by every run at one step"
        )
        out.append("")
        out.append(f"| comparisons | seeds | resolvable Δ at the budget: last / last {k} | at half of it |")
        out.append("|---|---|---|---|")
        groups: dict[tuple, list[str]] = {}
        for r in self.rows:
            key = (r["seeds"], r["baseline_seeds"], *(round(r[c], 6) for c in RESOLVABLE))
            groups.setdefault(key, []).append(r["variant"])
        for key, names in groups.items():
            vals = " / ".join(_fmt(v) for v in key[2:4]), " / ".join(_fmt(v) for v in key[4:6])
            out.append(f"| {', '.join(names)} vs baseline | {key[0]} vs {key[1]} | {vals[0]} | {vals[1]} |")
        out.append("")
        need = self.seeds_needed(1.0)
        out.append(
            f"seeds per arm for a ±{self.margin:g} difference at the budget: {need['final'] or '—'} "
            f"(last evaluation), {need[f'last_{k}'] or '—'} (mean of the last {k})"
        )
        return "\n".join(out + self.builds_text()) + "\n"

    def builds_text(self) -> list[str]:
        """Builds or seeds: what B builds x S seeds leave of a level's and a difference's sd."""
        b = self.build_sd
        if not b:
            return []
        out = [
            "",
            f"base-model builds ({b['source']}): between builds sd {b['level']:.3f} of a level and {b['delta']:.3f} "
            f"of a difference, within a build (seeds) {b['seed']:.3f}",
            "| builds x seeds | sd of a level | sd of a difference |",
            "|---|---|---|",
        ]
        for nb, ns in ((1, 4), (1, 8), (2, 2), (4, 1), (4, 2)):
            level = math.sqrt(b["level"] ** 2 / nb + b["seed"] ** 2 / (nb * ns))
            delta = math.sqrt(b["delta"] ** 2 / nb + 2 * b["seed"] ** 2 / (nb * ns))
            out.append(f"| {nb} x {ns} | {level:.3f} | {delta:.3f} |")
        if b["level"] > b["seed"]:
            out.append(
                "a level (or A) as a claim about the recipe, not about one build, needs builds: seeds on one build "
                f"leave its sd {b['level']:.3f}; say which build a study's levels describe"
            )
        return out


def build_spread(curves: pd.DataFrame) -> dict[str, Any]:
    """σ_b (a level between builds), τ (a difference between builds) and σ_s (seeds within a build):
    from ``curves`` where they hold several builds of a baseline, else as measured on the GPU
    (``MEASURED_BUILDS``)."""
    table = builds.by_build(curves) if "build" in curves else pd.DataFrame()
    base = table[table["variant"] == "baseline"] if len(table) else table
    if len(base) and base["builds"].iloc[0] > 1:
        deltas = table["delta_between_build_sd"].dropna() if "delta_between_build_sd" in table else pd.Series()
        return {
            "source": f"these runs, {int(base['builds'].iloc[0])} builds",
            "level": float(base["between_build_sd"].iloc[0]),
            "delta": float(np.sqrt(np.mean(deltas**2))) if len(deltas) else np.nan,
            "seed": float(base["within_build_sd"].iloc[0]),
        }
    return dict(MEASURED_BUILDS)


# micro on an H200, 3 deterministic builds x 2 seeds, the baseline and length=penalty (results/builds-gpu)
MEASURED_BUILDS = {
    "source": "measured in results/builds-gpu: micro, 3 builds",
    "level": 0.082,
    "delta": 0.012,
    "seed": 0.009,
}


def _fmt(v: float) -> str:
    return "—" if v is None or not np.isfinite(v) else f"{v:.3f}"


def plan(curves: pd.DataFrame, x: str, margin: float = DEFAULT_MARGIN, last_k: int = FitSettings.last_k) -> Plan:
    """The campaign's seed spread, evaluation noise, resolvable differences and seeds needed."""
    spread = {f: pooled_seed_sd(curves, x, f, last_k) for f in (1.0, 0.5)}
    p = Plan(x, margin, last_k, spread, evaluation_noise(curves, x), build_sd=build_spread(curves))
    seeds = curves.groupby("variant", sort=False)["seed"].nunique()
    if "baseline" in seeds:
        kb = int(seeds["baseline"])
        for v, kv in seeds.items():
            if v == "baseline":
                continue
            row = {"variant": v, "seeds": int(kv), "baseline_seeds": kb}
            for frac, suffix in ((1.0, ""), (0.5, "_half")):
                s = spread[frac]
                row[f"resolvable{suffix}"] = resolvable(s.sd_final, kv, kb) if s.dof else np.nan
                row[f"resolvable{suffix}_last_k"] = resolvable(s.sd_last_k, kv, kb) if s.dof else np.nan
            p.rows.append(row)
    return p

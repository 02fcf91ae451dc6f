"""Base-model builds in the across-size fit (issue 62): a size's parameters from its builds, the
between-build spread of A, and the size trend stated with it.

Builds of one size differ far more than seeds do (results/builds-gpu: at micro a level's sd is 0.082
between builds against 0.009 between seeds of a build, A's 0.10). So where a size holds several builds,
each build is fitted alone on its seeds and the size's A, log C_mid, log B and R0 are the means over
builds, each with the between-build standard error (sd across builds / sqrt(builds)), floored by
what the builds' own seeds leave. The forecast of a size carries one build's spread of A, pooled over
the fitted sizes that hold several builds, or where none does the value measured at micro, named as
such (``fits.combine_builds`` makes a size's fit from its builds'). ``size_trend`` restates the ceilings
across neighbouring sizes with intervals that include it, and where two do not separate, how many builds
per size would.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import ndtri

from scalefit.sizes.fits import SizeFit

SIGMA_BUILD_A = 0.10  # A's sd between builds measured at micro (results/builds-gpu: 0.102 over 3 builds)
SIGMA_BUILD_SOURCE = "measured at micro, results/builds-gpu"
SEPARATE_AT = 2.8  # a difference resolved when its se is at most |difference| / 2.8 (80% power at 5%, two-sided)
MAX_BUILDS = 50  # beyond this many builds per size a gap is reported as too small to resolve with builds


def build_sd_of_a(fits: list[SizeFit]) -> tuple[float, str, int]:
    """One build's sd of A: the between-build variance pooled over the sizes holding several builds (its
    degrees of freedom with it), else ``SIGMA_BUILD_A`` (0 degrees of freedom), with where it comes from."""
    ss, dof = 0.0, 0
    for f in fits:
        if f.n_builds >= 2:
            a = np.array([b.theta["A"] for b in f.build_fits])
            ss += float(((a - a.mean()) ** 2).sum())
            dof += len(a) - 1
    if dof:
        names = ", ".join(f.name for f in fits if f.n_builds >= 2)
        return float(np.sqrt(ss / dof)), f"pooled between builds of {names} ({dof} df)", dof
    return SIGMA_BUILD_A, SIGMA_BUILD_SOURCE, 0


def _one_build_var(f: SizeFit, sigma: float) -> float:
    """The variance of one build's A at this size: between builds plus its seeds' own."""
    seeds = np.mean([b.sd["A"] ** 2 for b in f.build_fits]) if f.build_fits else f.sd["A"] ** 2
    return sigma**2 + float(seeds)


def _se_a(f: SizeFit, sigma: float) -> float:
    """A's standard error with the build noise in it: a size of one build adds one build's spread to its
    seeds'; a size of several has its between-build se, at least what ``sigma`` gives for its builds."""
    if f.n_builds >= 2:
        return max(f.sd["A"], sigma / np.sqrt(f.n_builds))
    return float(np.hypot(f.sd["A"], sigma))


def builds_needed(diff: float, v_lo: float, v_hi: float) -> int | None:
    """Builds per size (of as many seeds as now) that bring the difference's se to |diff| / ``SEPARATE_AT``;
    None beyond ``MAX_BUILDS``."""
    if abs(diff) <= 0:
        return None
    need = int(np.ceil((v_lo + v_hi) * (SEPARATE_AT / abs(diff)) ** 2))
    return max(need, 2) if need <= MAX_BUILDS else None


def size_trend(fits: list[SizeFit], sigma: float, source: str, level: float) -> dict[str, Any]:
    """A's difference between each pair of neighbouring sizes (``fits`` smallest first), its interval with
    the build noise, whether it separates from zero, and for those that do not, the builds per size that
    would; with one statement in words."""
    z = float(ndtri(1 - (1 - level) / 2))
    pairs = []
    for lo, hi in zip(fits, fits[1:], strict=False):
        diff = hi.theta["A"] - lo.theta["A"]
        se = float(np.hypot(_se_a(lo, sigma), _se_a(hi, sigma)))
        separate = abs(diff) > z * se
        vlo, vhi = _one_build_var(lo, sigma), _one_build_var(hi, sigma)
        pairs.append(
            {
                "sizes": [lo.name, hi.name],
                "builds": [lo.n_builds, hi.n_builds],
                "A_difference": diff,
                "se": se,
                "interval": [diff - z * se, diff + z * se],
                "separate": bool(separate),
                "builds_needed": None if separate else builds_needed(diff, vlo, vhi),
            }
        )
    apart = [p for p in pairs if p["separate"]]
    if not pairs:
        statement = "one size: no trend to state"
    elif len(apart) == len(pairs):
        statement = f"every neighbouring pair's A separates beyond build noise (σ_build {sigma:.3f}, {source})"
    else:
        within = [p for p in pairs if not p["separate"]]
        named = "; ".join(
            f"{p['sizes'][0]}–{p['sizes'][1]} {_needed_words(p['builds_needed'], p['A_difference'])}" for p in within
        )
        statement = (
            f"{len(within)} of {len(pairs)} neighbouring pairs' A do not separate beyond build noise "
            f"(σ_build {sigma:.3f}, {source}): {named}"
        )
    return {"level": level, "sigma_build_A": sigma, "source": source, "pairs": pairs, "statement": statement}


def _needed_words(n: int | None, diff: float) -> str:
    if n is None:
        return f"needs more than {MAX_BUILDS} builds per size (a gap of {diff:+.3f})"
    return f"needs ≥ {n} builds per size"


def trend_lines(trend: dict[str, Any]) -> list[str]:
    """The size trend in words and numbers: each neighbouring pair's difference of A with its interval."""
    out = [f"size trend of A, with build noise (σ_build {trend['sigma_build_A']:.3f}, {trend['source']}):"]
    for p in trend["pairs"]:
        lo, hi = p["interval"]
        b = "/".join(str(n) for n in p["builds"])
        call = "separate" if p["separate"] else "within build noise"
        out.append(
            f"  {p['sizes'][0]:>8} → {p['sizes'][1]:<8} ΔA {p['A_difference']:+.3f} [{lo:+.3f}, {hi:+.3f}] "
            f"({trend['level']:.0%}; builds {b}): {call}"
        )
    out.append(f"  {trend['statement']}")
    return out


def builds_lines(fits: list[SizeFit], target: str, target_builds: int, sigma: float, source: str,
                 applied: bool, widened: tuple[float, float], level: float) -> list[str]:  # fmt: skip
    """How many builds each size holds, and what the forecast's uncertainty holds of the build noise."""
    per = ", ".join(f"{f.name} {f.n_builds}" for f in fits)
    word = "build" if target_builds == 1 else "builds"
    head = f"builds per size: {per}; {target} {target_builds} {word}"
    if applied:
        return [
            f"{head}. The band and A's interval carry one build's spread of A, σ_build {sigma:.3f} ({source}), "
            f"over {target}'s {target_builds} {word}"
        ]
    ratios = [sigma / f.sd["A"] for f in fits if f.sd["A"] > 0]
    lo, hi = widened
    return [
        f"{head}: each size's ± is its seeds' alone and lacks the between-build spread, so it understates each "
        f"size's uncertainty: σ_build of A {sigma:.3f} ({source}) is {min(ratios):.0f}–{max(ratios):.0f}x these ±; "
        f"with it added to {target}'s A alone, A's {level:.0%} interval would be [{lo:.3f}, {hi:.3f}] (not applied: "
        "this study cannot estimate it)"
    ]

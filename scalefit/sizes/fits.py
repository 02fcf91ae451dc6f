"""One size's sigmoid (``SizeFit``): fitted on its seeds pooled as ``fit_sigmoid`` fits it, refitted by
least squares (optionally at a B shared by every size), each parameter's spread from leaving out a seed
at a time, pooled over sizes against the fit's curvature; a size of several base-model builds fitted
build by build, its parameters the means over its builds with the between-build spread
(``combine_builds``)."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field

import numpy as np

from scalefit.errors import FitError
from scalefit.models.curve import sigmoid
from scalefit.models.grids import parse_grid
from scalefit.models.sigmoid import fit_sigmoid
from scalefit.sizes.data import SizeData

A_GRID = "0.05:1.0:0.01"


@dataclass
class SizeFit:
    """One size's sigmoid: its parameters (A, log C_mid, log B, R0) and their spread (``refit``)."""

    name: str
    params: float
    theta: dict[str, float]
    sd: dict[str, float]
    resid_sd: float  # one evaluation's scatter about the fit (seed offsets and evaluation noise)
    n_seeds: int
    curvature_sd: dict[str, float] = field(default_factory=dict)  # from the fit's curvature, evaluations independent
    b_slope: dict[str, float] = field(default_factory=dict)  # fitted with one B: how A and log C_mid move with it
    b_sd: float = 0.0  # and that B's spread (every size's draws move with one draw of it)
    build: str = ""  # the build this fit is of ("" the size's, all builds)
    n_builds: int = 1
    build_fits: list[SizeFit] = field(default_factory=list)  # each build's own fit, where there are several


def fit_size(name: str, d: SizeData, *, a_grid=A_GRID, seed: int = 0) -> SizeFit:
    """One size's sigmoid on its seeds pooled, as ``fit_sigmoid`` fits it (the paper's grid, then the
    polish), with each parameter's spread from leaving out one seed at a time (``refit``). A size of several
    builds: each build fitted so on its own seeds, the size's parameters their means with the between-build
    spread (``combine_builds``)."""
    if d.n_builds >= 2:
        fits = []
        for b, sub in d.by_build().items():
            try:
                fits.append(dataclasses.replace(fit_size(name, sub, a_grid=a_grid, seed=seed), build=b))
            except FitError as e:
                raise FitError(f"{e} (build {b!r}; fit each build on enough evaluations, or leave it out)") from None
        return combine_builds(fits)
    grid = parse_grid(a_grid, name="--a-grid", kind="step") if isinstance(a_grid, str) else a_grid
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            f = fit_sigmoid(d.compute, d.value, runs=d.seed, a_grid=grid)
        except FitError as e:
            raise FitError(f"size {name!r}: {e}") from None
    theta = {"A": f.A, "logC": float(np.log(f.C_mid)), "logB": float(np.log(f.B)), "R0": f.R0}
    return refit(SizeFit(name, d.params, theta, {}, 0.0, d.n_seeds), d)


def least_squares_sigmoid(c: np.ndarray, v: np.ndarray, r0: float, start: np.ndarray, log_b: float | None):
    """The sigmoid by least squares in (A, log C_mid[, log B]) from ``start``, R0 held (and B, at ``log_b``)."""
    from scipy.optimize import least_squares  # noqa: PLC0415

    lo = np.array([r0 + 1e-3, np.log(c.max() / 1000), np.log(0.05)])
    hi = np.array([1.0, np.log(c.max() * 50), np.log(20.0)])
    n = 3 if log_b is None else 2
    x0 = np.clip(start[:n], lo[:n] + 1e-9, hi[:n] - 1e-9)

    def resid(t: np.ndarray) -> np.ndarray:
        return sigmoid(c, t[0], np.exp(t[2] if log_b is None else log_b), np.exp(t[1]), r0) - v

    return least_squares(resid, x0, bounds=(lo[:n], hi[:n]))


def refit(f: SizeFit, d: SizeData, log_b: float | None = None) -> SizeFit:
    """``f`` refitted by least squares from its optimum (B held at ``log_b`` when given: the sizes fitted
    jointly with one B), each parameter's spread from leaving out one seed at a time (jackknife), or with
    one seed from the fit's curvature; at least what the seeds resolve of one evaluation's scatter. A size of
    several builds: each build refitted so, combined again (``combine_builds``)."""
    if f.build_fits:
        subs = d.by_build()
        return combine_builds([dataclasses.replace(refit(b, subs[b.build], log_b), build=b.build)
                               for b in f.build_fits])  # fmt: skip
    r0, use = f.theta["R0"], d.compute > 0
    start = np.array([f.theta["A"], f.theta["logC"], f.theta["logB"]])
    best = least_squares_sigmoid(d.compute[use], d.value[use], r0, start, log_b)
    resid_sd = float(np.std(best.fun))
    seeds = np.unique(d.seed[use])
    k = len(seeds)
    curvature = np.diag(np.linalg.pinv(best.jac.T @ best.jac)) * resid_sd**2
    if k >= 2:
        jk = np.array(
            [least_squares_sigmoid(d.compute[use & (d.seed != s)], d.value[use & (d.seed != s)], r0, best.x, log_b).x
             for s in seeds]
        )  # fmt: skip
        var = (k - 1) / k * ((jk - jk.mean(axis=0)) ** 2).sum(axis=0)
    else:
        var = curvature * 4  # x4: one run's evaluations are correlated
    floor = resid_sd / np.sqrt(k)
    gain = max(best.x[0] - r0, 0.05)
    c0 = d.compute == 0
    sd = {
        "A": max(float(np.sqrt(var[0])), floor),
        "logC": max(float(np.sqrt(var[1])), floor / gain),
        "logB": max(float(np.sqrt(var[2])), 0.02) if log_b is None else 1e-3,
        "R0": max(float(np.std(d.value[c0], ddof=1) / np.sqrt(c0.sum())) if c0.sum() > 1 else 0.01, 1e-3),
    }
    theta = {"A": float(best.x[0]), "logC": float(best.x[1]), "logB": float(best.x[2] if log_b is None else log_b)}
    names = ("A", "logC") if log_b is not None else ("A", "logC", "logB")
    curv = dict(zip(names, np.sqrt(curvature), strict=False))
    return SizeFit(f.name, f.params, {**theta, "R0": r0}, sd, resid_sd, k, curv)


def pooled_spread(fits: list[SizeFit]) -> list[SizeFit]:
    """Each size's spread as its curvature's, scaled by the sizes' median ratio of leave-a-seed-out spread to
    curvature: a few seeds make one size's jackknife a noisy estimate, the ratio pooled over sizes a steadier one."""
    out = [dataclasses.replace(f, sd=dict(f.sd)) for f in fits]
    for p in ("A", "logC", "logB"):
        have = [f for f in out if f.n_seeds >= 2 and f.curvature_sd.get(p, 0) > 0]
        if len(have) < 2:
            continue
        ratio = float(np.median([f.sd[p] / f.curvature_sd[p] for f in have]))
        for f in have:
            f.sd[p] = max(f.curvature_sd[p] * ratio, f.sd[p] if p == "logB" else 0.0, 1e-3)
    return out


def combine_builds(builds: list[SizeFit]) -> SizeFit:
    """One size's fit from its builds' fits (each on its own seeds): each parameter the mean over builds,
    its spread the between-build standard error, at least what the builds' own spreads leave."""
    nb = len(builds)
    theta = {p: float(np.mean([b.theta[p] for b in builds])) for p in builds[0].theta}
    sd = {}
    for p in builds[0].sd:
        between = float(np.std([b.theta[p] for b in builds], ddof=1)) / np.sqrt(nb)
        within = float(np.sqrt(np.mean([b.sd[p] ** 2 for b in builds]) / nb))
        sd[p] = max(between, within, 1e-3)
    resid = float(np.sqrt(np.mean([b.resid_sd**2 for b in builds])))
    return dataclasses.replace(
        builds[0], theta=theta, sd=sd, resid_sd=resid, n_seeds=sum(b.n_seeds for b in builds),
        curvature_sd={}, b_slope={}, b_sd=0.0, build="", n_builds=nb, build_fits=list(builds),
    )  # fmt: skip

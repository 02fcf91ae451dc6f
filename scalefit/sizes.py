"""Across model size (issue 44): predict a larger model's curve from smaller ones.

Per size, the sigmoid as today (``fit_sigmoid`` on its seeds pooled), each parameter's spread from
leaving out a seed at a time; the sizes also fitted jointly with one B, kept where that predicts
held-out sizes better. Then A, log C_mid and log B (and R0 where the size's base model was not
evaluated) as functions of the parameter count N. Each parameter has candidate forms (constant,
log-linear, and for A the saturating power law A_inf - k N^-alpha); the combination is chosen by
how well it predicts a held-out size's whole curve (leave-one-size-out RMSE), not by how well it
fits (both are reported).

A forecast of a size that was not fitted draws the per-size parameters within their spread, refits the
laws on every draw and adds each law's own misfit, measured on the held-out sizes (so the band is
calibrated by held-out error, not by the fit's residuals alone), and the evaluation noise of the
size's mean curve. It gives the whole curve with its band, A with its interval, the compute at which
the curve passes the largest fitted size's ceiling, and whether it is predictable, with reasons in
numbers. ``backtest_sizes`` forecasts each size from the others the same way and states coverage.

Where a size's runs started from several base-model builds, it is fitted build by build and its
parameters are the means over builds with the between-build spread; the forecast carries one build's
spread of A, and the size trend is stated with it (``scalefit.size_builds``, issue 62).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scalefit.curve import sigmoid
from scalefit.errors import FitError
from scalefit.fit import fit_sigmoid
from scalefit.grids import parse_grid
from scalefit.outputs import check_writable, write_json
from scalefit.size_builds import (
    build_sd_of_a,
    builds_lines,
    combine_builds,
    size_trend,
    trend_lines,
)

A_GRID = "0.05:1.0:0.01"
ALPHAS = np.geomspace(0.05, 3.0, 40)  # the saturating power law's exponents searched
PARAMS = ("A", "logC", "logB", "R0")
FORMS: dict[str, tuple[str, ...]] = {
    "A": ("constant", "log-linear", "saturating"),
    "logC": ("constant", "log-linear"),  # log-linear in log N: C_mid a power law of N
    "logB": ("constant", "log-linear"),
    "R0": ("constant", "log-linear"),
}
N_PARAMS = {"constant": 1, "log-linear": 2, "saturating": 3}
MIN_SIZES = 2
H = 0.05  # the step in log B at which the sizes' sensitivity to the shared B is measured
MAX_REACH = 4.0  # a forecast this many times past the largest fitted N is an extrapolation too far


@dataclass
class SizeData:
    """One size's runs: its parameter count and every evaluation (compute, value, seed, and the base-model
    build its run started from, where recorded)."""

    params: float
    compute: np.ndarray
    value: np.ndarray
    seed: np.ndarray
    build: np.ndarray | None = None

    def mean_curve(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The seeds' mean at each compute with how many seeds it averages (evaluations at one compute)."""
        df = pd.DataFrame({"c": self.compute, "v": self.value}).groupby("c")["v"].agg(["mean", "size"])
        return df.index.to_numpy(float), df["mean"].to_numpy(float), df["size"].to_numpy(float)

    @property
    def n_seeds(self) -> int:
        """Its runs: distinct seeds, of each build where there are several."""
        if self.n_builds < 2:
            return len(np.unique(self.seed))
        return len({(str(b), str(s)) for b, s in zip(self.build, self.seed, strict=True)})

    @property
    def n_builds(self) -> int:
        return 1 if self.build is None else len(np.unique(self.build))

    def by_build(self) -> dict[str, SizeData]:
        """Each build's runs alone, in the order of their labels."""
        if self.build is None:
            return {"": self}
        out = {}
        for b in np.unique(self.build):
            m = self.build == b
            out[str(b)] = SizeData(self.params, self.compute[m], self.value[m], self.seed[m])
        return out

    def r0(self) -> float | None:
        """The base model's value (evaluations at compute 0), or None when it has none."""
        at0 = self.compute == 0
        return float(self.value[at0].mean()) if at0.any() else None


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


@dataclass
class Choice:
    """A combination of forms, one per parameter, with its in-sample and held-out scores."""

    forms: dict[str, str]
    fit_rss: float  # weighted residual sum of squares of the laws on every fitted size (fit quality)
    loso_rmse: float  # curve RMSE predicting each fitted size from the others (held-out error)

    @property
    def label(self) -> str:
        return ", ".join(f"{p}: {f}" for p, f in self.forms.items())


@dataclass
class SizeForecast:
    """The forecast of one size's curve from the other sizes' fits."""

    name: str
    params: float
    level: float
    choice: Choice
    choices: list[Choice]
    compute: np.ndarray  # where the curve and its band are given
    curve: np.ndarray  # median of the draws
    lo: np.ndarray
    hi: np.ndarray
    A: float
    A_interval: tuple[float, float]
    pass_level: float  # the largest fitted size's ceiling (its A)
    pass_compute: float  # median compute at which the forecast passes it (inf: most draws never do)
    pass_interval: tuple[float, float]
    pass_share: float  # share of draws that pass it at all
    misfit_sd: dict[str, float]  # each law's own misfit on held-out sizes, added to the draws
    fits: list[SizeFit]  # the fitted sizes, smallest first
    joint_b: bool  # the sizes fitted with one B (it predicted held-out sizes better than one B a size)
    predictable: bool
    reasons: list[str]
    draws: dict[str, np.ndarray] = field(repr=False, default_factory=dict)
    actual: dict[str, Any] | None = None  # the size's own runs against the forecast, when they exist
    n_builds: int = 1  # builds its measured mean will average
    build_sd: float = 0.0  # one build's sd of A: pooled from the fitted sizes' builds, else the measured one
    build_source: str = ""
    build_applied: bool = False  # the band and A's interval carry it (a study with several builds a size)
    A_interval_builds: tuple[float, float] = (0.0, 0.0)  # A's interval with it (= A_interval where applied)
    trend: dict[str, Any] = field(default_factory=dict)  # neighbouring sizes' A with build noise (size_trend)

    def band_at(
        self, compute: np.ndarray, n_seeds: np.ndarray | float, n_builds: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``level`` band of a mean of ``n_seeds`` evaluations at ``compute`` (of ``n_builds`` builds:
        default the forecast's own)."""
        draws = self.curve_draws(compute, n_builds)
        noise = self.draws["noise_sd"][:, None] / np.sqrt(np.asarray(n_seeds, float))
        rng = np.random.default_rng(1)
        draws = draws + noise * rng.standard_normal((len(draws), 1))  # pointwise quantiles: one draw a row will do
        q = (1 - self.level) / 2
        return np.quantile(draws, q, axis=0), np.quantile(draws, 1 - q, axis=0)

    def curve_draws(self, compute, n_builds: int | None = None) -> np.ndarray:
        d = self.draws
        c = np.asarray(compute, float)[None, :]
        a = d["A"]
        if n_builds is not None and self.build_applied:
            a = np.clip(d["A_law"] + self.build_sd * d["z_build"] / np.sqrt(n_builds), d["R0"] + 1e-3, 1.0)
        return sigmoid(c, a[:, None], np.exp(d["logB"])[:, None], np.exp(d["logC"])[:, None], d["R0"][:, None])


def size_data(curves: Mapping[str, tuple]) -> dict[str, SizeData]:
    """{size: (parameters, compute, value, seed[, build])} as ``SizeData``, checked: one line naming the fix.
    A build of None (or one label) is one build."""
    if not curves:
        raise FitError("no sizes: the curves need a size and a parameters column, one size per model")
    out = {}
    for name, (n, c, v, s, *b) in curves.items():
        if not np.isfinite(n) or n <= 0:
            raise FitError(f"size {name!r}: parameters = {n!r}; give each size its parameter count (> 0)")
        c, v = np.asarray(c, float), np.asarray(v, float)
        build = None if not b or b[0] is None else pd.Series(b[0]).fillna("").astype(str).to_numpy()
        build = build if build is not None and len(np.unique(build)) > 1 else None
        out[name] = SizeData(float(n), c, v, np.asarray(s if s is not None else np.zeros(len(c))), build)
    by_n: dict[float, str] = {}
    for name, d in out.items():
        if d.params in by_n:
            raise FitError(
                f"sizes {by_n[d.params]!r} and {name!r} have the same parameter count {d.params:g}: one is a "
                "duplicate; give each size its own count, or join their runs under one name"
            )
        by_n[d.params] = name
    return dict(sorted(out.items(), key=lambda kv: kv[1].params))


def fit_size(name: str, d: SizeData, *, a_grid=A_GRID, seed: int = 0) -> SizeFit:
    """One size's sigmoid on its seeds pooled, as ``fit_sigmoid`` fits it (the paper's grid, then the
    polish), with each parameter's spread from leaving out one seed at a time (``refit``). A size of several
    builds: each build fitted so on its own seeds, the size's parameters their means with the between-build
    spread (``size_builds.combine_builds``)."""
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


def _least_squares(c: np.ndarray, v: np.ndarray, r0: float, start: np.ndarray, log_b: float | None):
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
    several builds: each build refitted so, combined again (``size_builds.combine_builds``)."""
    if f.build_fits:
        subs = d.by_build()
        return combine_builds([dataclasses.replace(refit(b, subs[b.build], log_b), build=b.build)
                               for b in f.build_fits])  # fmt: skip
    r0, use = f.theta["R0"], d.compute > 0
    start = np.array([f.theta["A"], f.theta["logC"], f.theta["logB"]])
    best = _least_squares(d.compute[use], d.value[use], r0, start, log_b)
    resid_sd = float(np.std(best.fun))
    seeds = np.unique(d.seed[use])
    k = len(seeds)
    curvature = np.diag(np.linalg.pinv(best.jac.T @ best.jac)) * resid_sd**2
    if k >= 2:
        jk = np.array(
            [_least_squares(d.compute[use & (d.seed != s)], d.value[use & (d.seed != s)], r0, best.x, log_b).x
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


def _design(form: str, x: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """The linear basis of a form at x = log(N / N_ref): constant, log-linear, or the saturating power law."""
    if form == "constant":
        return np.ones((len(x), 1))
    if form == "log-linear":
        return np.column_stack([np.ones(len(x)), x])
    return np.column_stack([np.ones(len(x)), -np.exp(-alpha * x)])


def law_predict(
    form: str, x: np.ndarray, y: np.ndarray, w: np.ndarray, x_new: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least squares of a form on every row of ``y`` (draws x sizes) at once: predictions at
    ``x_new`` (draws x new) and each row's weighted residual sum of squares. The saturating form is
    linear given its exponent: every exponent of ``ALPHAS`` is solved and each row keeps its best."""
    y = np.atleast_2d(y)
    sw = np.sqrt(w)
    best_pred = best_rss = None
    for alpha in ALPHAS if form == "saturating" else (1.0,):
        X = _design(form, x, alpha)
        coef, *_ = np.linalg.lstsq(X * sw[:, None], (y * sw).T, rcond=None)  # (k, draws)
        rss = (((X @ coef).T - y) ** 2 * w).sum(axis=1)
        pred = (_design(form, x_new, alpha) @ coef).T
        if best_rss is None:
            best_pred, best_rss = pred, rss
        else:
            better = rss < best_rss - 1e-15
            best_pred = np.where(better[:, None], pred, best_pred)
            best_rss = np.where(better, rss, best_rss)
    return best_pred, best_rss


def _x(params: np.ndarray, ref: float) -> np.ndarray:
    return np.log(np.asarray(params, float) / ref)


def _curve_rmse(theta: dict[str, float], d: SizeData) -> float:
    c, v, _ = d.mean_curve()
    pred = sigmoid(c, theta["A"], np.exp(theta["logB"]), np.exp(theta["logC"]), theta["R0"])
    return float(np.sqrt(np.mean((pred - v) ** 2)))


def _fittable(forms: dict[str, str], n: int) -> bool:
    return all(N_PARAMS[f] <= n for f in forms.values())


def _combos(n_fit: int, with_r0: bool, one_b: bool = False) -> list[dict[str, str]]:
    """Every combination of forms that the others of ``n_fit`` sizes can fit (each held out in turn); B
    constant only where the sizes were fitted with one B."""
    params = [p for p in PARAMS if with_r0 or p != "R0"]
    forms = {**FORMS, "logB": ("constant",)} if one_b else FORMS
    out = [dict(zip(params, f, strict=True)) for f in product(*(forms[p] for p in params))]
    return [c for c in out if _fittable(c, n_fit - 1)]


def _point_theta(fits: list[SizeFit], forms: dict[str, str], ref: float, n_new: float) -> dict[str, float]:
    x = _x(np.array([f.params for f in fits]), ref)
    out = {}
    for p, form in forms.items():
        y = np.array([f.theta[p] for f in fits])
        w = 1 / np.array([f.sd[p] for f in fits]) ** 2
        out[p] = float(law_predict(form, x, y, w, _x(np.array([n_new]), ref))[0][0, 0])
    return out


def choose_forms(fits: list[SizeFit], data: dict[str, SizeData], r0_known: bool, one_b: bool = False) -> list[Choice]:
    """Every combination of forms scored by its fit (weighted RSS of the laws) and by predicting each size
    from the others (the held-out curve RMSE); best held-out error first."""
    ref = fits[0].params
    choices = []
    for forms in _combos(len(fits), not r0_known, one_b):
        rss = 0.0
        x = _x(np.array([f.params for f in fits]), ref)
        for p, form in forms.items():
            y = np.array([f.theta[p] for f in fits])
            w = 1 / np.array([f.sd[p] for f in fits]) ** 2
            rss += float(law_predict(form, x, y, w, x[:1])[1][0])
        errs = []
        for j, held in enumerate(fits):
            others = fits[:j] + fits[j + 1 :]
            theta = _point_theta(others, forms, ref, held.params)
            if r0_known:
                theta["R0"] = held.theta["R0"]
            theta["A"] = min(theta["A"], 1.0)
            errs.append(_curve_rmse(theta, data[held.name]))
        choices.append(Choice(forms, rss, float(np.sqrt(np.mean(np.square(errs))))))
    if not choices:
        raise FitError(f"{len(fits)} fitted size(s): predicting a size from the others needs at least {MIN_SIZES + 1}")
    # the fewest parameters among the equally good: a tie goes to the simpler law
    return sorted(choices, key=lambda c: (round(c.loso_rmse, 6), sum(N_PARAMS[f] for f in c.forms.values())))


def _misfit(fits: list[SizeFit], forms: dict[str, str], n_draws: int, rng: np.random.Generator) -> dict[str, float]:
    """Each law's own scatter about the sizes: its held-out error beyond what the sizes' spread explains."""
    ref = fits[0].params
    out = {}
    for p, form in forms.items():
        e2, v = [], []
        for j, held in enumerate(fits):
            others = fits[:j] + fits[j + 1 :]
            if N_PARAMS[form] > len(others):
                continue
            x = _x(np.array([f.params for f in others]), ref)
            y = np.array([f.theta[p] for f in others])
            sd = np.array([f.sd[p] for f in others])
            draws = y + sd * rng.standard_normal((n_draws, len(others)))
            pred = law_predict(form, x, draws, 1 / sd**2, _x(np.array([held.params]), ref))[0][:, 0]
            e2.append((held.theta[p] - np.median(pred)) ** 2 - held.sd[p] ** 2)
            v.append(np.var(pred))
        out[p] = float(np.sqrt(max(0.0, np.mean(np.array(e2) - np.array(v))))) if e2 else 0.0
    return out


def _per_size(
    free: list[SizeFit], data: Mapping[str, SizeData], r0_known: bool
) -> tuple[list[SizeFit], list[Choice], bool]:
    """The sizes fitted one by one, or jointly with one B (its spread-weighted mean): whichever predicts
    held-out sizes better (``choose_forms``); one B steadies A and C_mid where the budget leaves them traded
    against B. Returns the fits, their forms' scores and whether B is shared."""
    free = pooled_spread(free)
    w = np.array([1 / f.sd["logB"] ** 2 for f in free])
    b = np.array([f.theta["logB"] for f in free])
    log_b = float(np.sum(w * b) / w.sum())
    b_sd = max(float(np.sqrt(1 / w.sum())), float(np.sqrt(np.sum(w * (b - log_b) ** 2) / w.sum())))
    joint = pooled_spread([refit(f, data[f.name], log_b) for f in free])
    for f in joint:  # how each size's A and C_mid move with the one B: its spread moves every size together
        d, use, start = data[f.name], data[f.name].compute > 0, np.array([f.theta["A"], f.theta["logC"], log_b])
        up, down = (_least_squares(d.compute[use], d.value[use], f.theta["R0"], start, log_b + h).x for h in (H, -H))
        f.b_slope = {"A": (up[0] - down[0]) / (2 * H), "logC": (up[1] - down[1]) / (2 * H), "logB": 1.0}
        f.b_sd = b_sd
    one_by_one, together = choose_forms(free, dict(data), r0_known), choose_forms(joint, dict(data), r0_known, True)
    if together[0].loso_rmse <= one_by_one[0].loso_rmse:
        return joint, together, True
    return free, one_by_one, False


def forecast_size(
    data: Mapping[str, SizeData],
    target: str,
    *,
    params: float | None = None,
    r0: float | None = None,
    n_seeds: int | None = None,
    n_builds: int | None = None,
    level: float = 0.9,
    tolerance: float = 0.03,
    n_draws: int = 400,
    a_grid=A_GRID,
    seed: int = 0,
    fits: Mapping[str, SizeFit] | None = None,
) -> SizeForecast:
    """Forecast size ``target``'s curve from every other size in ``data`` (its own runs, if there, are
    compared with the forecast, never fitted). ``params``: its parameter count when it has no runs;
    ``r0``: its base model's value (else its compute-0 evaluations, else the sizes' R0 law);
    ``n_seeds``: how many seeds its measured mean will average (else its own, else the others' median);
    ``n_builds``: how many builds (else its own, else the others' median). Where any size holds several
    builds, A's draws carry one build's spread of A over ``n_builds`` (``size_builds.build_sd_of_a``)."""
    params, fitted = _forecast_inputs(data, target, params)
    fits_given = fits
    free = [fits[k] if fits and k in fits else fit_size(k, d, a_grid=a_grid, seed=seed) for k, d in fitted.items()]
    own = data.get(target)
    if r0 is None and own is not None:
        r0 = own.r0()
    fits, choices, joint = _per_size(free, fitted, r0 is not None)
    choice = choices[0]
    draws, misfit = _law_draws(fits, choice, params, r0, n_draws, seed)
    k = n_seeds or (own.n_seeds if own is not None else int(np.median([f.n_seeds for f in fits])))
    nb = n_builds or (own.n_builds if own is not None else int(np.median([f.n_builds for f in fits])))
    build_sd, build_source, _ = build_sd_of_a(fits)
    applied = any(f.n_builds >= 2 for f in fits) or (own is not None and own.n_builds >= 2) or nb >= 2
    draws["A_law"] = draws["A"]
    draws["z_build"] = np.random.default_rng([seed, 62]).standard_normal(n_draws)  # its own stream: the rest stays
    with_builds = np.clip(draws["A_law"] + build_sd * draws["z_build"] / np.sqrt(nb), draws["R0"] + 1e-3, 1.0)
    if applied:
        draws["A"] = with_builds
    c_max = max(float(d.compute.max()) for d in data.values())
    grid = np.unique(np.concatenate([np.linspace(0, c_max, 101), own.mean_curve()[0] if own is not None else []]))
    none = np.array([])
    fc = SizeForecast(
        name=target, params=float(params), level=level, choice=choice, choices=choices, compute=grid, curve=none,
        lo=none, hi=none, A=0.0, A_interval=(0.0, 0.0), pass_level=0.0, pass_compute=0.0, pass_interval=(0.0, 0.0),
        pass_share=0.0, misfit_sd=misfit, fits=fits, joint_b=joint, predictable=False, reasons=[], draws=draws,
        n_builds=nb, build_sd=build_sd, build_source=build_source, build_applied=applied,
    )  # fmt: skip
    fc.curve = np.median(fc.curve_draws(grid), axis=0)
    fc.lo, fc.hi = fc.band_at(grid, k)
    q = (1 - level) / 2
    fc.A = float(np.median(draws["A"]))
    fc.A_interval = (float(np.quantile(draws["A"], q)), float(np.quantile(draws["A"], 1 - q)))
    fc.A_interval_builds = (float(np.quantile(with_builds, q)), float(np.quantile(with_builds, 1 - q)))
    _passing(fc, fits[-1], q)
    fc.predictable, fc.reasons = _verdict(fc, fits, tolerance)
    own_fit = None
    if own is not None and (own.compute > 0).any():  # its runs so far (rows at compute 0 alone give its R0)
        fc.actual, own_fit = _against_actual(fc, own, a_grid, seed, (fits_given or {}).get(target))
    fc.trend = size_trend(fits + ([own_fit] if own_fit else []), build_sd, build_source, level)
    return fc


def _forecast_inputs(
    data: Mapping[str, SizeData], target: str, params: float | None
) -> tuple[float, dict[str, SizeData]]:
    """The target's parameter count (its runs' if it has some) and the sizes fitted (every other one),
    refusing a target of unknown size or too few others."""
    if target in data:
        params = data[target].params
    if params is None:
        raise FitError(f"size {target!r} has no runs: give its parameter count (--params) to forecast it")
    fitted = {k: v for k, v in data.items() if k != target}
    if len(fitted) < MIN_SIZES + 1:
        raise FitError(
            f"{len(fitted)} size(s) besides {target!r}: forecasting one size needs at least {MIN_SIZES + 1} others "
            "(each law is chosen by predicting a fitted size from the rest)"
        )
    return params, fitted


def _law_draws(
    fits: list[SizeFit], choice: Choice, params: float, r0: float | None, n_draws: int, seed: int
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Draws of the target's parameters from the chosen laws (each size's fit drawn within its errors,
    one B shift shared by every size, plus each law's misfit), and the misfit sd of each parameter."""
    rng = np.random.default_rng(seed)
    misfit = _misfit(fits, choice.forms, n_draws, rng)
    ref = fits[0].params
    x = _x(np.array([f.params for f in fits]), ref)
    draws: dict[str, np.ndarray] = {}
    shift = fits[0].b_sd * rng.standard_normal((n_draws, 1))  # one B for every size: its draw, shared
    for p, form in choice.forms.items():
        y = np.array([f.theta[p] for f in fits])
        sd = np.array([f.sd[p] for f in fits])
        slope = np.array([f.b_slope.get(p, 0.0) for f in fits])
        ys = y + slope * shift + sd * rng.standard_normal((n_draws, len(fits)))
        pred = law_predict(form, x, ys, 1 / sd**2, _x(np.array([params]), ref))[0][:, 0]
        draws[p] = pred + misfit[p] * rng.standard_normal(n_draws)
    if r0 is not None:
        draws["R0"] = np.full(n_draws, float(r0))
    draws["A"] = np.clip(draws["A"], draws["R0"] + 1e-3, 1.0)
    resid = np.array([f.resid_sd for f in fits])
    draws["noise_sd"] = np.full(n_draws, float(np.sqrt(np.mean(resid**2))))
    return draws, misfit


def _passing(fc: SizeForecast, top: SizeFit, q: float) -> None:
    """The compute at which each draw's curve passes the largest fitted size's ceiling (inf: never)."""
    d, y = fc.draws, top.theta["A"]
    fc.pass_level = y
    ratio = (d["A"] - d["R0"]) / np.maximum(y - d["R0"], 1e-12) - 1.0
    ok = (d["A"] > y) & (y > d["R0"]) & (ratio > 0)
    c = np.full(len(ratio), np.inf)
    c[ok] = np.exp(d["logC"][ok]) * ratio[ok] ** (-1.0 / np.exp(d["logB"][ok]))
    fc.pass_share = float(ok.mean())
    fc.pass_compute = float(np.quantile(c, 0.5, method="inverted_cdf"))
    fc.pass_interval = tuple(float(np.quantile(c, x, method="inverted_cdf")) for x in (q, 1 - q))  # inf: never


def _verdict(fc: SizeForecast, fits: list[SizeFit], tolerance: float) -> tuple[bool, list[str]]:
    """Predictable when the chosen laws predicted held-out sizes within ``tolerance``, A's interval is
    that narrow, and the size lies within MAX_REACH of the largest fitted one; reasons in numbers."""
    reasons = []
    if fc.choice.loso_rmse > tolerance:
        reasons.append(f"the laws predicted held-out sizes to RMSE {fc.choice.loso_rmse:.3f} > {tolerance}")
    half = (fc.A_interval[1] - fc.A_interval[0]) / 2
    if half > tolerance:
        reasons.append(f"A's {fc.level:.0%} interval is ±{half:.3f} wide (> ±{tolerance})")
    reach = fc.params / fits[-1].params
    if reach > MAX_REACH:
        reasons.append(f"{reach:.1f}x the largest fitted size's parameters (> {MAX_REACH:g}x)")
    if len(fits) < 4:
        reasons.append(f"only {len(fits)} fitted sizes: the laws' held-out error rests on {len(fits)} folds")
    if (stalled := _ceiling_stalled(fits, fc.A)) and reach > 1:
        reasons.append(stalled)
    ok = not reasons
    if ok:
        reasons = [
            f"held-out RMSE {fc.choice.loso_rmse:.3f} <= {tolerance}, A ±{half:.3f}, {reach:.1f}x the largest size"
        ]
    return ok, reasons


def _ceiling_stalled(fits: list[SizeFit], forecast_a: float) -> str | None:
    """Why this forecast should not be trusted upwards: it puts A above the largest fitted size's by more
    than their spread while that size's A is not above the next one's by more than it (results/scale-gpu:
    mini 0.790, medium 0.777, a forecast of 0.948 for large, which reached 0.695). A forecast that
    stays level with the largest sizes (a constant law) is not what this warns of."""
    if len(fits) < 2:
        return None
    top, prev = fits[-1], fits[-2]
    spread = float(np.hypot(top.sd["A"], prev.sd["A"]))
    if top.theta["A"] - prev.theta["A"] > spread or forecast_a <= top.theta["A"] + spread:
        return None
    return (
        f"the ceiling stopped rising with size: {top.name}'s A {top.theta['A']:.3f} is not above "
        f"{prev.name}'s {prev.theta['A']:.3f} by more than their spread (±{spread:.3f}), yet the laws put "
        f"this size's at {forecast_a:.3f}"
    )


def _against_actual(
    fc: SizeForecast, own: SizeData, a_grid, seed: int, own_fit: SizeFit | None = None
) -> tuple[dict[str, Any], SizeFit | None]:
    """The size's own runs against its forecast: its own A (fitted on its runs; with several builds, their
    mean), the error, whether the interval holds it, the share of its mean curve's evaluations inside the
    band and, with several builds, of each build's mean curve inside the band of one build; and its fit."""
    c, v, k = own.mean_curve()
    lo, hi = fc.band_at(c, k)
    rl = c > 0
    inside = (v >= lo) & (v <= hi)
    out: dict[str, Any] = {
        "points": int(rl.sum()),
        "band_coverage": float(inside[rl].mean()) if rl.any() else float("nan"),
        "rmse": float(np.sqrt(np.mean((np.interp(c[rl], fc.compute, fc.curve) - v[rl]) ** 2))) if rl.any() else None,
    }
    if own.n_builds >= 2:
        by_build = {}
        for b, sub in own.by_build().items():
            cb, vb, kb = sub.mean_curve()
            lo_b, hi_b = fc.band_at(cb, kb, n_builds=1)
            if (cb > 0).any():
                by_build[b] = float(((vb >= lo_b) & (vb <= hi_b))[cb > 0].mean())
        out.update(band_coverage_by_build=by_build, band_coverage_builds_mean=float(np.mean(list(by_build.values()))))
    try:
        own_fit = own_fit or fit_size(fc.name, own, a_grid=a_grid, seed=seed)
    except FitError as e:
        out.update(A=None, A_error=None, A_inside=None, note=str(e))
        return out, None
    a = own_fit.theta["A"]
    out.update(A=a, A_error=fc.A - a, A_inside=bool(fc.A_interval[0] <= a <= fc.A_interval[1]))
    return out, own_fit


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

    def lines(self) -> list[str]:
        hit, n = self.a_hits
        out = [
            f"leave-one-size-out backtest: {len(self.rows)} size(s) forecast from the others; "
            f"{self.level:.0%} band holds {self.coverage:.0%} of their evaluations; A inside its interval {hit}/{n}"
        ]
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
    rows = []
    for name in data:
        if len(data) - 1 < MIN_SIZES + 1:
            break
        fc = forecast_size(data, name, fits=fits, **kw)
        act = fc.actual or {}
        rows.append(
            {
                "size": name,
                "parameters": fc.params,
                "A_forecast": fc.A,
                "A_lo": fc.A_interval[0],
                "A_hi": fc.A_interval[1],
                "A": act.get("A"),
                "A_error": act.get("A_error"),
                "A_inside": act.get("A_inside"),
                "band_coverage": act.get("band_coverage"),
                "points": act.get("points", 0),
                "rmse": act.get("rmse"),
                "predictable": fc.predictable,
                "forms": fc.choice.label,
            }
        )
    return SizesBacktest(pd.DataFrame(rows), kwargs.get("level", 0.9))


def forecast_lines(fc: SizeForecast) -> list[str]:
    """The forecast in words and numbers."""
    lo, hi = fc.A_interval
    p_lo, p_hi = fc.pass_interval
    how = "jointly, one B for every size" if fc.joint_b else "one by one"
    if any(f.n_builds >= 2 for f in fc.fits):
        out = [f"per size (each build's sigmoid on its own seeds, fitted {how}; the size's parameters the mean over"
               " its builds, ± the between-build standard error):"]  # fmt: skip
    else:
        out = [f"per size (the sigmoid on its seeds pooled, fitted {how}; ± from leaving out a seed):"]
    out += [
        f"  {f.name:<10} N {f.params / 1e6:8.3f}M  A {f.theta['A']:.3f} ±{f.sd['A']:.3f}  "
        f"C_mid {np.exp(f.theta['logC']):.3g}  B {np.exp(f.theta['logB']):.2f}  R0 {f.theta['R0']:.3f}"
        f"  seeds {f.n_seeds}" + (f"  builds {f.n_builds}" if f.n_builds >= 2 else "")
        for f in fc.fits
    ]
    out += builds_lines(fc.fits, fc.name, fc.n_builds, fc.build_sd, fc.build_source, fc.build_applied,
                        fc.A_interval_builds, fc.level)  # fmt: skip
    out.append("forms across sizes (chosen by held-out error; fit quality beside it):")
    for c in fc.choices[:6]:
        mark = "*" if c is fc.choice else " "
        out.append(f" {mark} held-out RMSE {c.loso_rmse:.4f}  fit RSS {c.fit_rss:9.3f}  {c.label}")
    misfit = ", ".join(f"{p} {v:.3g}" for p, v in fc.misfit_sd.items())
    out.append(f"misfit added (held-out, beyond the sizes' spread): {misfit}")
    passing = (
        f"passes {fc.pass_level:.3f} (the largest fitted size's A) at {fc.pass_compute:.3g} "
        f"[{p_lo:.3g}, {p_hi:.3g}] ({fc.pass_share:.0%} of draws pass it)"
        if fc.pass_share >= 0.5
        else f"does not pass {fc.pass_level:.3f} (the largest fitted size's A) in {1 - fc.pass_share:.0%} of draws"
    )
    out += [
        f"forecast of {fc.name} (N {fc.params / 1e6:.3f}M): A {fc.A:.3f} [{lo:.3f}, {hi:.3f}] ({fc.level:.0%});"
        f" {passing}",
        f"  {'predictable' if fc.predictable else 'not predictable'}: " + "; ".join(fc.reasons),
    ]
    if fc.actual is not None:
        a = fc.actual
        own = (
            f"its own A {a['A']:.3f} (error {a['A_error']:+.3f},"
            f" {'inside' if a['A_inside'] else 'outside'} the interval)"
            if a.get("A") is not None
            else f"its own fit failed ({a.get('note', '')})"
        )
        out.append(f"  actual: {own}; band holds {a['band_coverage']:.0%} of its {a['points']} evaluations")
        if "band_coverage_by_build" in a:
            each = ", ".join(f"{b} {v:.0%}" for b, v in a["band_coverage_by_build"].items())
            out.append(f"  by build (each against one build's band): {each}; mean {a['band_coverage_builds_mean']:.0%}")
    if fc.trend:
        out += trend_lines(fc.trend)
    return out


def plot_sizes(data: Mapping[str, SizeData], fc: SizeForecast, path: str | Path) -> Path:
    """Every size's mean curve (points) and fit (line), the forecast's median and band, and the forecast
    size's own curve drawn over it when it exists."""
    import matplotlib  # noqa: PLC0415 - only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(data)))
    by_name = {f.name: f for f in fc.fits}
    for color, (name, d) in zip(colors, data.items(), strict=True):
        c, v, _ = d.mean_curve()
        label = f"{name} ({d.params / 1e6:.2g}M, {d.n_builds} build{'s' if d.n_builds > 1 else ''})"
        if name == fc.name:
            ax.plot(c, v, "o-", color="crimson", ms=4, lw=1, label=f"{label}: actual", zorder=5)
            continue
        ax.plot(c, v, "o", color=color, ms=3, alpha=0.7)
        f = by_name.get(name)
        if f is not None:
            grid = np.linspace(0, c.max(), 200)
            t = f.theta
            ax.plot(grid, sigmoid(grid, t["A"], np.exp(t["logB"]), np.exp(t["logC"]), t["R0"]), "-", color=color,
                    label=label)  # fmt: skip
    band = f"{fc.name}: forecast {fc.level:.0%} band"
    ax.fill_between(fc.compute, fc.lo, fc.hi, color="crimson", alpha=0.15, label=band)
    ax.plot(fc.compute, fc.curve, "--", color="crimson", label=f"{fc.name}: forecast, A {fc.A:.3f}")
    ax.axhline(fc.pass_level, color="gray", lw=0.8, ls=":")
    ax.set_xlabel("compute")
    ax.set_ylabel("mean@16")
    ax.set_title(f"across sizes: fits, and the forecast of {fc.name}")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def read_sizes(
    path: str, x: str, y: str, size_col: str = "size", params_col: str = "parameters", build_col: str = "build"
) -> dict[str, SizeData]:
    """A curves CSV with a size and a parameters column (as ``python -m analysis fit`` writes a scale
    campaign's), its seeds in ``seed`` and, where there, each run's base-model build in ``build_col``:
    every row checked as ``scalefit fit`` checks them."""
    from scalefit.cli import read_curves  # noqa: PLC0415 - the CSV checks every command shares

    df = pd.read_csv(path) if Path(path).is_file() else None
    if df is not None and params_col not in df.columns:
        raise FitError(f"{path}: no column {params_col!r}: each row needs its size's parameter count "
                       f"(`python -m analysis fit CAMPAIGN` writes it for a scale campaign)")  # fmt: skip
    curves = read_curves(path, x, y, size_col, "seed" if df is not None and "seed" in df.columns else None)
    if size_col not in df.columns:
        raise FitError(f"{path}: no column {size_col!r}: each row needs the size of the model that made it")
    n = df.groupby(df[size_col].astype(str))[params_col].agg(["min", "max"])
    varies = n[n["min"] != n["max"]]
    if len(varies):
        raise FitError(f"{path}: size {varies.index[0]!r} has more than one parameter count; one per size")
    builds = (
        {str(k): g[build_col].fillna("").astype(str).to_numpy() for k, g in df.groupby(size_col, sort=False)}
        if build_col in df.columns
        else {}
    )
    return size_data({k: (float(n.loc[k, "min"]), c, v, s, builds.get(k)) for k, (c, v, s) in curves.items()})


def forecast_record(fc: SizeForecast) -> dict[str, Any]:
    """The forecast as data, to commit before the size runs: its curve with the band, A with its
    interval, the compute at which it passes the largest fitted size's A, the verdict and the laws."""
    return {
        "size": fc.name,
        "parameters": fc.params,
        "level": fc.level,
        "A": fc.A,
        "A_interval": list(fc.A_interval),
        "passes": {"A": fc.pass_level, "compute": _finite(fc.pass_compute),
                   "interval": [_finite(c) for c in fc.pass_interval], "share_of_draws": fc.pass_share},  # fmt: skip
        "predictable": fc.predictable,
        "reasons": fc.reasons,
        "builds": {
            "target": fc.n_builds,
            "per_size": {f.name: f.n_builds for f in fc.fits},
            "sigma_build_A": fc.build_sd,
            "source": fc.build_source,
            "in_band": fc.build_applied,
            "A_interval_with_builds": list(fc.A_interval_builds),
        },
        "size_trend": fc.trend,
        "forms": fc.choice.forms,
        "held_out_rmse": fc.choice.loso_rmse,
        "fitted_sizes": {f.name: {"builds": f.n_builds, "parameters": f.params, **f.theta} for f in fc.fits},
        "curve": {"compute": fc.compute.tolist(), "median": fc.curve.tolist(), "lo": fc.lo.tolist(),
                  "hi": fc.hi.tolist()},  # fmt: skip
        "actual": fc.actual,
    }


def _finite(c: float) -> float | None:
    """A compute as JSON: null where the curve never passes (inf)."""
    return float(c) if np.isfinite(c) else None


def cmd_sizes(args) -> int:
    """``python -m scalefit sizes CURVES.csv``: fit every size but the held-out one, forecast it, backtest."""
    if args.builds is not None and args.builds < 1:
        raise FitError(f"--builds {args.builds}: give how many base-model builds its mean will average (1 or more)")
    check_writable(args.json, "--json")
    check_writable(args.plot, "--plot")
    say = functools.partial(print, file=sys.stderr if args.json == "-" else sys.stdout)
    data = read_sizes(args.csv, args.x, args.y, args.size_col, args.params_col, args.build_col)
    target = args.holdout or list(data)[-1]
    if target not in data and args.params is None:
        raise FitError(f"--holdout {target!r} is not a size of {args.csv} ({', '.join(data)}); give --params N to "
                       "forecast a size that has no runs")  # fmt: skip
    kw = {"level": args.level, "tolerance": args.tolerance, "a_grid": args.a_grid}
    t0 = time.perf_counter()
    fits = {k: fit_size(k, d, a_grid=args.a_grid) for k, d in data.items() if k != target}
    fc = forecast_size(
        data, target, params=args.params, r0=args.r0, n_seeds=args.seeds, n_builds=args.builds, fits=fits, **kw
    )
    seconds = time.perf_counter() - t0
    say("\n".join(forecast_lines(fc)))
    say(f"(across-size fits and forecast: {seconds:.2f} s)")
    fitted = {k: d for k, d in data.items() if k != target}
    if len(fitted) > MIN_SIZES + 1:
        say("\n".join(backtest_sizes(fitted, fits=fits, **kw).lines()))
    if args.plot:
        path = plot_sizes(data, fc, args.plot)
        say(f"plot: {path}")
    write_json(forecast_record(fc), args.json)
    return 0


def add_parser(sub) -> None:
    """The ``sizes`` subcommand of ``python -m scalefit``."""
    p = sub.add_parser(
        "sizes",
        help="fit curves across model sizes and forecast a held-out size",
        description="Per size the sigmoid; across sizes A, C_mid and B as functions of parameter count N, their "
        "forms chosen by leave-one-size-out error; the held-out size's curve with a calibrated band, A with its "
        "interval, the compute at which it passes the largest fitted size's ceiling, and a verdict; then a "
        "leave-one-size-out backtest of the fitted sizes with its coverage.",
    )
    p.add_argument("csv", help="CSV with one row per evaluation, a size and a parameters column (and seed)")
    p.add_argument("--x", default="compute/samples", help="compute column (default: compute/samples)")
    p.add_argument("--y", default="val/mean_at_16", help="pass-rate column (default: val/mean_at_16)")
    p.add_argument("--size-col", default="size", help="column naming each row's model size (default: size)")
    p.add_argument("--params-col", default="parameters", help="column of its parameter count (default: parameters)")
    p.add_argument("--holdout", metavar="SIZE", help="the size to forecast (default: the largest); its runs, if any, "
                   "are compared with the forecast, never fitted")  # fmt: skip
    p.add_argument("--params", type=float, metavar="N", help="the held-out size's parameter count, when it has no runs")
    p.add_argument("--r0", type=float, help="the held-out size's base-model value (default: its compute-0 rows, "
                   "else the sizes' R0 law)")  # fmt: skip
    p.add_argument("--seeds", type=int, help="seeds its measured mean will average (default: its own, else the median)")
    p.add_argument("--builds", type=int, help="base-model builds it will average (default: its own, else the median)")
    p.add_argument("--build-col", default="build", help="column of each run's base-model build, where the CSV has "
                   "one (default: build); a size of several builds is fitted build by build")  # fmt: skip
    p.add_argument("--level", type=float, default=0.9, help="band and interval level (default: 0.9)")
    p.add_argument("--tolerance", type=float, default=0.03, help="held-out error and A half-width a predictable "
                   "forecast stays within (default: 0.03)")  # fmt: skip
    p.add_argument("--a-grid", default=A_GRID, metavar="LO:HI:STEP", help=f"per-size A grid (default: {A_GRID})")
    p.add_argument("--plot", metavar="PATH.png", help="every size's points and fits, the forecast band, the actual")
    p.add_argument("--json", metavar="PATH|-", help="the forecast as JSON (its curve and band, A and its "
                   "interval, where it passes the largest fitted A, the verdict): commit it before the size "
                   "runs")  # fmt: skip
    p.set_defaults(func=cmd_sizes)

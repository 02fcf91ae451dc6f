"""The forecast of one size's curve from the other sizes' fits (``forecast_size``): a ``SizeForecast``, which
is a ``CurveForecast`` as every forecast is, so its bands, intervals, ``Verdict`` and record are read as any
forecast's. It is complete when built.

The draws (``SizeDraws``) take every fitted size's parameters within their spread, refit the chosen laws on
each and add each law's misfit measured on held-out sizes (so the band is calibrated by held-out error, not
by the fit's residuals alone), and the evaluation noise of the size's mean curve; where any size holds
several base-model builds, A's draws carry one build's spread over the forecast size's builds. From them:
the curve with its band, A with its interval, the compute at which the curve passes the largest fitted
size's ceiling, and whether it is predictable, with reasons in numbers. Where the size's own runs exist
they are compared, never fitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalefit.errors import FitError
from scalefit.forecasts.interface import CurveForecast, Verdict
from scalefit.models.curve import sigmoid
from scalefit.reasons import Reason
from scalefit.sizes.actual import against_actual
from scalefit.sizes.builds import build_sd_of_a, size_trend
from scalefit.sizes.data import SizeData, compute_reached
from scalefit.sizes.fits import A_GRID, SizeFit, fit_size
from scalefit.sizes.laws import MIN_SIZES, Choice, Misfit, law_draws, per_size

MAX_REACH = 4.0  # a forecast this many times past the largest fitted N is an extrapolation too far
PARAM_DRAWS = {"A": ("A", False), "B": ("logB", True), "C_mid": ("logC", True), "R0": ("R0", False)}


@dataclass(frozen=True, eq=False)
class SizeDraws:
    """Draws of a size's sigmoid parameters from the laws (``A``, ``logC``, ``logB``, ``R0``; ``A_law`` before
    the build spread, ``z_build`` its standard normal draws, ``noise_sd`` one evaluation's scatter), and the
    curves and bands they give."""

    values: dict[str, np.ndarray] = field(repr=False)
    level: float
    build_sd: float  # one build's sd of A
    build_applied: bool  # A's draws carry it over the size's builds

    def __getitem__(self, key: str) -> np.ndarray:
        return self.values[key]

    def mean(self, compute, builds: int | None = None) -> np.ndarray:
        """Draws of the mean curve at each compute (of a mean over ``builds`` builds: default the size's own)."""
        d = self.values
        c = np.atleast_1d(np.asarray(compute, float))[None, :]
        a = d["A"]
        if builds is not None and self.build_applied:
            a = np.clip(d["A_law"] + self.build_sd * d["z_build"] / np.sqrt(builds), d["R0"] + 1e-3, 1.0)
        return sigmoid(c, a[:, None], np.exp(d["logB"])[:, None], np.exp(d["logC"])[:, None], d["R0"][:, None])

    def evaluation(self, compute, n_runs: np.ndarray | float = 1, builds: int | None = None) -> np.ndarray:
        """Draws of a mean of ``n_runs`` evaluations at each compute: the mean curve's, plus their noise
        (pointwise quantiles are all they give: one noise draw a row)."""
        draws = self.mean(compute, builds)
        noise = self.values["noise_sd"][:, None] / np.sqrt(np.asarray(n_runs, float))
        return draws + noise * np.random.default_rng(1).standard_normal((len(draws), 1))

    def band(
        self, compute, n_runs: np.ndarray | float = 1, builds: int | None = None, level: float | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        q = (1 - (self.level if level is None else level)) / 2
        draws = self.evaluation(compute, n_runs, builds)
        return np.quantile(draws, q, axis=0), np.quantile(draws, 1 - q, axis=0)

    def interval(self, param: str, level: float | None = None) -> tuple[float, float]:
        """``param`` (A, B, C_mid or R0) at ``level`` (default the forecast's) from the draws."""
        if param not in PARAM_DRAWS:
            raise ValueError(f"no parameter {param!r}: a size forecast draws {', '.join(PARAM_DRAWS)}")
        key, log = PARAM_DRAWS[param]
        x = np.exp(self.values[key]) if log else self.values[key]
        q = (1 - (self.level if level is None else level)) / 2
        return float(np.quantile(x, q)), float(np.quantile(x, 1 - q))


@dataclass(frozen=True)
class Passing:
    """Where a size's forecast passes the largest fitted size's ceiling."""

    level: float  # the largest fitted size's A
    compute: float  # median compute at which the draws' curves pass it (inf: most never do)
    interval: tuple[float, float]  # inf: never
    share: float  # share of draws that pass it at all


@dataclass(frozen=True, eq=False)
class SizeForecast(CurveForecast):
    """The forecast of one size's curve from the other sizes' fits, complete when built (frozen; two are
    equal only when they are one)."""

    name: str
    params: float
    level: float
    choice: Choice
    choices: list[Choice]
    fits: list[SizeFit]  # the fitted sizes, smallest first
    joint_b: bool  # the sizes fitted with one B (it predicted held-out sizes better than one B a size)
    misfit: dict[str, Misfit]  # each law's own misfit on held-out sizes (shrunk to the prior), added to the draws
    draws: SizeDraws
    n_seeds: int  # seeds its measured mean averages: the band's
    n_builds: int  # builds its measured mean will average
    build_source: str  # where one build's sd of A comes from
    A_interval_builds: tuple[float, float]  # A's interval with one build's spread (= interval("A") where applied)
    compute: np.ndarray  # where the curve and its band are given
    curve: np.ndarray  # median of the draws
    lo: np.ndarray
    hi: np.ndarray
    A: float
    passes: Passing  # where it passes the largest fitted size's ceiling
    verdict: Verdict
    actual: dict[str, Any] | None  # the size's own runs against the forecast, where they exist
    trend: dict[str, Any]  # neighbouring sizes' A with build noise (``builds.size_trend``)

    @property
    def build_sd(self) -> float:
        """One build's sd of A: pooled from the fitted sizes' builds, else the measured one."""
        return self.draws.build_sd

    @property
    def build_applied(self) -> bool:
        """Whether the band and A's interval carry it (a study with several builds a size)."""
        return self.draws.build_applied

    def point(self, compute) -> np.ndarray:
        return np.median(self.mean_draws(compute), axis=0)

    def interval(self, param: str) -> tuple[float, float]:
        return self.draws.interval(param)

    def mean_draws(self, compute, builds: int | None = None) -> np.ndarray:
        """Draws of the mean curve (of ``builds`` builds: default the forecast's own)."""
        return self.draws.mean(compute, builds)

    def prediction_draws(self, compute, n_runs: np.ndarray | float = 1, builds: int | None = None) -> np.ndarray:
        return self.draws.evaluation(compute, n_runs, builds)

    def prediction_band(
        self, compute, n_runs: np.ndarray | float = 1, level: float | None = None, builds: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The band of a mean of ``n_runs`` evaluations at each compute (of ``builds`` builds: default the
        forecast's own)."""
        return self.draws.band(compute, n_runs, builds, level)

    def to_dict(self) -> dict[str, Any]:
        """The forecast as data, to commit before the size runs: its curve with the band, A with its
        interval, the compute at which it passes the largest fitted size's A, the verdict and the laws."""
        return {
            "size": self.name,
            "parameters": self.params,
            "level": self.level,
            "A": self.A,
            "A_interval": list(self.interval("A")),
            "passes": {
                "A": self.passes.level,
                "compute": _finite(self.passes.compute),
                "interval": [_finite(c) for c in self.passes.interval],
                "share_of_draws": self.passes.share,
            },
            "predictable": self.verdict.predictable,
            "reasons": self.verdict.reasons,
            "builds": {
                "target": self.n_builds,
                "per_size": {f.name: f.n_builds for f in self.fits},
                "sigma_build_A": self.build_sd,
                "source": self.build_source,
                "in_band": self.build_applied,
                "A_interval_with_builds": list(self.A_interval_builds),
            },
            "size_trend": self.trend,
            "forms": self.choice.forms,
            "held_out_rmse": self.choice.loso_rmse,
            "fitted_sizes": {f.name: {"builds": f.n_builds, "parameters": f.params, **f.theta} for f in self.fits},
            "curve": self._curve_record(),
            "actual": self.actual,
        }

    def _curve_record(self) -> dict[str, Any]:
        """The curve and its band for a mean of ``n_seeds`` runs over ``n_builds`` builds; with several
        builds also one build's band (a mean of its share of the runs), which ``judge`` holds each build's
        curve against once the size has run."""
        out: dict[str, Any] = {"compute": self.compute.tolist(), "median": self.curve.tolist(), "lo": self.lo.tolist(),
                               "hi": self.hi.tolist(), "runs": self.n_seeds, "builds": self.n_builds}  # fmt: skip
        if self.n_builds >= 2:
            runs = max(1, round(self.n_seeds / self.n_builds))
            lo, hi = self.prediction_band(self.compute, runs, builds=1)
            out["one_build"] = {"runs": runs, "lo": lo.tolist(), "hi": hi.tolist()}
        return out


def _finite(c: float) -> float | None:
    """A compute as JSON: null where the curve never passes (inf)."""
    return float(c) if np.isfinite(c) else None


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
    builds, A's draws carry one build's spread of A over ``n_builds`` (``builds.build_sd_of_a``)."""
    params, fitted = _forecast_inputs(data, target, params)
    given = fits or {}
    free = [given[k] if k in given else fit_size(k, d, a_grid=a_grid, seed=seed) for k, d in fitted.items()]
    own = data.get(target)
    if r0 is None and own is not None:
        r0 = own.r0()
    sized, choices, joint = per_size(free, fitted, r0 is not None)
    choice = choices[0]
    values, misfit = law_draws(sized, choice, params, r0, n_draws, seed)
    k = n_seeds or (own.n_seeds if own is not None else int(np.median([f.n_seeds for f in sized])))
    nb = n_builds or (own.n_builds if own is not None else int(np.median([f.n_builds for f in sized])))
    build_sd, build_source, applied, with_builds = _build_spread(values, sized, own, nb, seed)
    draws = SizeDraws(values, level, build_sd, applied)
    c_max = max(float(d.compute.max()) for d in data.values())
    grid = np.unique(np.concatenate([np.linspace(0, c_max, 101), own.mean_curve()[0] if own is not None else []]))
    curve = np.median(draws.mean(grid), axis=0)
    lo, hi = draws.band(grid, k)
    a, a_interval = float(np.median(values["A"])), draws.interval("A")
    q = (1 - level) / 2
    own_fit, actual = None, None
    if own is not None and (own.compute > 0).any():  # its runs so far (rows at compute 0 alone give its R0)
        actual, own_fit = against_actual(draws.band, target, own, (grid, curve), a, a_interval, a_grid, seed,
                                         given.get(target), compute_reached(data, target))  # fmt: skip
    return SizeForecast(
        name=target, params=float(params), level=level, choice=choice, choices=choices, fits=sized, joint_b=joint,
        misfit=misfit, draws=draws, n_seeds=k, n_builds=nb, build_source=build_source,
        A_interval_builds=(float(np.quantile(with_builds, q)), float(np.quantile(with_builds, 1 - q))),
        compute=grid, curve=curve, lo=lo, hi=hi, A=a, passes=_passing(values, sized[-1], q),
        verdict=_verdict(choice, a, a_interval, level, float(params), sized, tolerance), actual=actual,
        trend=size_trend(sized + ([own_fit] if own_fit else []), build_sd, build_source, level),
    )  # fmt: skip


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


def _build_spread(
    values: dict[str, np.ndarray], fits: list[SizeFit], own: SizeData | None, nb: int, seed: int
) -> tuple[float, str, bool, np.ndarray]:
    """One build's sd of A (``builds.build_sd_of_a``), drawn into A's draws over ``nb`` builds where any size
    holds several (``values`` gains ``A_law``, A before it, and ``z_build``): that sd, where it comes from,
    whether A's draws carry it, and A's draws with it."""
    build_sd, source, _ = build_sd_of_a(fits)
    applied = any(f.n_builds >= 2 for f in fits) or (own is not None and own.n_builds >= 2) or nb >= 2
    values["A_law"] = values["A"]
    values["z_build"] = np.random.default_rng([seed, 62]).standard_normal(len(values["A"]))  # its own stream
    with_builds = np.clip(values["A_law"] + build_sd * values["z_build"] / np.sqrt(nb), values["R0"] + 1e-3, 1.0)
    if applied:
        values["A"] = with_builds
    return build_sd, source, applied, with_builds


def _passing(d: Mapping[str, np.ndarray], top: SizeFit, q: float) -> Passing:
    """Where the draws' curves pass the largest fitted size's ceiling (``top``'s A)."""
    y = top.theta["A"]
    ratio = (d["A"] - d["R0"]) / np.maximum(y - d["R0"], 1e-12) - 1.0
    ok = (d["A"] > y) & (y > d["R0"]) & (ratio > 0)
    c = np.full(len(ratio), np.inf)
    c[ok] = np.exp(d["logC"][ok]) * ratio[ok] ** (-1.0 / np.exp(d["logB"][ok]))
    interval = tuple(float(np.quantile(c, x, method="inverted_cdf")) for x in (q, 1 - q))  # inf: never
    return Passing(y, float(np.quantile(c, 0.5, method="inverted_cdf")), interval, float(ok.mean()))


def _verdict(
    choice: Choice, a: float, a_interval: tuple[float, float], level: float, params: float, fits: list[SizeFit],
    tolerance: float,
) -> Verdict:  # fmt: skip
    """Predictable when the chosen laws predicted held-out sizes within ``tolerance``, A's interval is
    that narrow, and the size lies within MAX_REACH of the largest fitted one; reasons in numbers (a
    predictable one's says by how much)."""
    reasons = []
    if choice.loso_rmse > tolerance:
        reasons.append(Reason("laws_error", {"rmse": choice.loso_rmse, "tolerance": tolerance}))
    half = (a_interval[1] - a_interval[0]) / 2
    if half > tolerance:
        reasons.append(Reason("a_interval", {"level": level, "half": half, "tolerance": tolerance}))
    reach = params / fits[-1].params
    if reach > MAX_REACH:
        reasons.append(Reason("size_reach", {"reach": reach, "max": MAX_REACH}))
    if len(fits) < 4:
        reasons.append(Reason("sizes", {"n": len(fits)}))
    if (stalled := _ceiling_stalled(fits, a)) and reach > 1:
        reasons.append(stalled)
    if reasons:
        return Verdict(False, reasons)
    held = {"rmse": choice.loso_rmse, "tolerance": tolerance, "half": half, "reach": reach}
    return Verdict(True, [Reason("sizes_held", held)])


def _ceiling_stalled(fits: list[SizeFit], forecast_a: float) -> Reason | None:
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
    numbers = {"top_A": top.theta["A"], "prev_A": prev.theta["A"], "spread": spread, "forecast_A": forecast_a}
    return Reason("stalled", numbers, {"top": top.name, "prev": prev.name})

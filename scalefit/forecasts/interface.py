"""The forecast interface: what every forecast answers, and what is written once for all of them.

``Forecast`` is the base of every forecast: a variant fitted alone (``scalefit.forecasts.single.SingleForecast``,
any curve model) and a variant of a campaign's joint fit (``scalefit.forecasts.pooled.PooledForecast``).
Comparisons, plots, stop decisions, adaptive campaigns and the LOO table read either through it and
never ask which one they hold. Every forecast answers:

- **bands**: ``confidence_band`` (the mean curve), ``prediction_band`` (a new evaluation) and
  ``target_band`` (the mean of k runs' evaluations at a target, or of their last ``w``:
  ``mean_windows``), with the draws behind them (``mean_draws``, ``prediction_draws``, ``target_draws``);
- ``interval(param)``, ``expected_error`` (at its own target) and ``expected_error_at``;
- ``backtests`` and the ``calibration`` they set; ``verdict`` (``judge``);
- ``call_difference``: a variant against the baseline at a budget (``Call``); ``own()``: the
  forecast from the variant's own data alone, which a call past the data must agree with.

``CampaignForecast`` is the result a campaign's fit gives, whichever model made it.

Written once, here: the backtest record (``Backtest``), which later point a backtest from an origin
scores (``backtest_target``) and how (``score_backtest``), the bands' ``calibration``, the
``Verdict`` and its ladder (``Forecast.judge``: each model's checks are its hooks ``doubts``,
``error_doubt``, ``structure_doubts``) and the call. What really differs between the models is
declared on each class, once: ``max_backtests``, ``backtest_resamples``, ``paired`` (resample i of
every variant comes from one simulated campaign) and ``error_name``.

Above ``Forecast``, ``CurveForecast`` declares the part every forecast of a curve answers, however it
was made: the forecast of a model size from smaller ones (``scalefit.sizes.SizeForecast``) is one too.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
from scipy.special import ndtri

from scalefit.defaults import DEFAULT_MARGIN
from scalefit.forecasts.slower_or_lower import Knee, Separation, knee_from_data, separate
from scalefit.forecasts.uncertainty import central_percentiles, interval_holding
from scalefit.ladder import against_margin
from scalefit.models.base import CurveFit
from scalefit.reasons import Reason

DEFAULT_RATIO = 2.0  # the paper's LOO practice: fit to 8k GPU-h, extrapolate to 16k
# the sigmoid's shape error (sd) at 2x its data before any backtest: the tuning studies' (docs/benchmarks.md)
SHAPE_PRIOR_SD = 0.035
SHAPE_PRIOR_WEIGHT = 4.0  # that prior's weight, in backtests
# a backtest informs the shape error when it looked ahead at least this share of the question's
# distance in log-compute: nearer ones answer another question (a prefix's spread a short way ahead)
SAME_REACH = 2 / 3
MIN_FIT_SHARE = 0.25  # backtests that landed close can halve the fit's own spread (sd), not remove it
MIN_BACKTESTS = 2  # a prediction no two backtests checked is not predictable, and carries no call past the data
STRUCTURE_Z = 3.0  # the latest third of the points this many standard errors off the curve: structure
PREDICTION_DRAWS = 4000
BAND_CHUNK_FLOATS = 2_000_000  # draws x compute values per chunk of a band
UNSEPARATED = {"worse": "slower or lower", "better": "faster or higher"}  # what an open ceiling leaves open
DECIDED = ("worse", "no difference", "better")


@dataclass
class NoiseModel:
    """Deviation of each run from the mean curve: AR(1) over successive evaluations."""

    sigma: float  # marginal standard deviation of one evaluation around the mean curve
    phi: float  # lag-1 correlation between successive evaluations of one run
    dof: int  # residual degrees of freedom behind sigma
    sigma_eval: float | None  # the evaluation's own sampling sd, when its size is known
    n_runs: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "sigma": self.sigma,
            "phi": self.phi,
            "dof": self.dof,
            "sigma_eval": self.sigma_eval,
            "n_runs": self.n_runs,
        }


@dataclass
class Backtest:
    """One rolling-origin backtest: fitted up to ``origin``, scored on a later fitted point."""

    origin: float
    target: float  # the farthest scored point (ratio <= the question's)
    predicted: float
    observed: float
    sd: float  # the prefix model's prediction sd at the target
    ratio: float = DEFAULT_RATIO  # the question's extrapolation ratio
    n_runs: int = 1  # the observation is the mean of this many runs' evaluations (its noise is sigma^2 / k)

    @property
    def error(self) -> float:
        return self.predicted - self.observed

    @property
    def reach_factor(self) -> float:
        """How much farther the question looks than this backtest could: extrapolation error grows
        with the distance in log-compute, so a backtest that looked 1.5x ahead for a 2x question
        counts log 2 / log 1.5 times its error (never less than once)."""
        return max(float(np.log(self.ratio) / np.log(self.target / self.origin)), 1.0)

    @property
    def scaled_error(self) -> float:
        """The error carried to the question's ratio."""
        return self.error * self.reach_factor

    @property
    def z(self) -> float:
        return self.error / self.sd if self.sd > 0 else np.inf


def backtest_target(compute: np.ndarray, origin: float, ratio: float, gap: float = 1e-9) -> float | None:
    """The point a backtest from ``origin`` scores: the farthest of ``compute`` within ``ratio`` x
    the origin, if it looks at least sqrt(ratio) ahead (half the question's distance in
    log-compute); None when none does. ``gap``: how far past the origin a point must lie."""
    ahead = compute[(compute > origin * (1 + gap)) & (compute <= origin * ratio * (1 + 1e-9))]
    if not len(ahead) or ahead.max() < origin * np.sqrt(ratio) * (1 - 1e-9):
        return None
    return float(ahead.max())


def score_backtest(
    prefix: Forecast, origin: float, compute: np.ndarray, value: np.ndarray, ratio: float, window: int = 1
) -> Backtest:
    """``prefix`` (a forecast from the points up to ``origin``) scored on what the question predicts:
    the mean of the runs' last ``window`` evaluations up to ``backtest_target`` (one evaluation where
    fewer than ``window`` lie past the origin), its point prediction and the sd of its draws of that mean."""
    t = backtest_target(compute, origin, ratio)
    after = np.unique(compute[(compute > origin * (1 + 1e-9)) & (compute <= t)])
    w = window if len(after) >= window else 1
    at = after[-w:]
    observed = float(np.mean([value[compute == c].mean() for c in at]))
    n_runs = int((compute == t).sum())
    draws = prefix.target_draws(at, n_runs, window=w)
    return Backtest(origin, t, float(prefix.point(at).mean()), observed, float(np.std(draws)), ratio, n_runs)


@dataclass(frozen=True)
class Calibration:
    """What the backtests add to a forecast's spread, additively: a shape error, the sigmoid being
    the wrong curve, whose variance grows with the square of the distance past the data in
    log-compute and is ``shape_var`` at twice the data. Negative where the backtests landed closer
    than the model claimed: the fit's own spread then shrinks by as much (never below zero, and the
    seeds' noise is never shrunk; the fit's sd at most halved, ``MIN_FIT_SHARE``). ``calibrate``
    estimates it."""

    shape_var: float = 0.0
    backtests: int = 0

    def reach(self, compute, c_fit: float) -> np.ndarray:
        """How far past the data each compute lies, in doublings, squared (0 within the data)."""
        c = np.atleast_1d(np.asarray(compute, float))
        return np.where(c > c_fit, np.log(np.maximum(c, c_fit) / c_fit) / np.log(2.0), 0.0) ** 2

    def widen(
        self, point: np.ndarray, fit_dev: np.ndarray, noise: np.ndarray, compute, c_fit: float, seed: int
    ) -> np.ndarray:
        """Calibrated draws (draws x computes): the point, the fit's deviations (``fit_dev``) and the
        seeds' (``noise``), with the shape error added (or, negative, taken from the fit's spread).
        Resample i's shape error is one normal draw scaled along the computes, the same draw for
        every forecast made with ``seed`` (a campaign's variants: loo-gpu's arms all missed upwards
        together), so a paired difference between two variants does not carry it; a level does."""
        add = self.shape_var * self.reach(compute, c_fit)[None, :]
        if self.shape_var >= 0:  # one draw per resample: a bent curve, not noise from point to point
            n = len(fit_dev)  # stratified normal quantiles, shuffled: every band sees the same spread
            z = ndtri((np.random.default_rng(seed + 7).permutation(n) + 0.5) / n)[:, None]
            return point + fit_dev + noise + z * np.sqrt(add)
        v = fit_dev.var(axis=0, keepdims=True)
        scale = np.sqrt(np.maximum(v + add, MIN_FIT_SHARE * v) / np.where(v > 0, v, 1.0))
        return point + scale * fit_dev + noise

    @property
    def shape_sd(self) -> float:
        """The shape error's sd at twice the data, signed: negative where the fit's spread shrank."""
        return float(np.sign(self.shape_var) * np.sqrt(abs(self.shape_var)))

    def text(self) -> str:
        if self.shape_var >= 0:
            return f"shape error ±{self.shape_sd:.3f} at 2x the data ({self.backtests} backtests)"
        return f"the fit's spread less {-self.shape_sd:.3f} (sd) at 2x the data ({self.backtests} backtests)"


def calibrate(backtests: Iterable[Backtest]) -> Calibration:
    """The shape error from backtests that looked about as far ahead as the question (``SAME_REACH``),
    each scored on what the question predicts: its squared error
    less the variance its prefix forecast claimed, carried to 2x by the square of its reach, and
    shrunk towards ``SHAPE_PRIOR_SD`` with ``SHAPE_PRIOR_WEIGHT`` (method of moments: unbiased for
    the shape variance whatever the model's own spread, and free to go below zero)."""
    terms = [
        (b.error**2 - b.sd**2) * (np.log(2.0) / np.log(b.target / b.origin)) ** 2
        for b in backtests
        if np.isfinite(b.error) and b.sd > 0 and np.log(b.target / b.origin) >= SAME_REACH * np.log(b.ratio)
    ]
    shape = (SHAPE_PRIOR_WEIGHT * SHAPE_PRIOR_SD**2 + float(np.sum(terms))) / (SHAPE_PRIOR_WEIGHT + len(terms))
    return Calibration(shape, len(terms))


def spread_out(origins: list[float], n: int) -> list[float]:
    """At most ``n`` of the feasible backtest origins, spread from the earliest to the latest (so that
    they look as far ahead as the question where the data allow, not from ``n`` neighbouring points)."""
    if len(origins) <= n:
        return list(origins)
    return [origins[int(i)] for i in np.unique(np.round(np.linspace(0, len(origins) - 1, n)))]


def error_trend(backtests: list[Backtest], margin: float, c_fit: float) -> float | None:
    """Compute, as a factor on ``c_fit``, where the backtest error trend (log |error| against log
    origin) reaches the margin; None when the errors do not shrink with compute."""
    if len(backtests) < 3:
        return None
    x = np.log([b.origin for b in backtests])
    y = np.log(np.maximum([abs(b.scaled_error) for b in backtests], 1e-6))
    slope, icpt = np.polyfit(x, y, 1)
    if slope >= -0.05:
        return None
    c_needed = float(np.exp((np.log(margin) - icpt) / slope))  # the origin whose error the trend puts at the margin
    return max(c_needed / c_fit, 1.0)


@dataclass
class Verdict:
    """``predictable`` or not, every reason in numbers. ``error_only``: identified, its only flaws a
    band wider than the margin (the error against it, an open ceiling above: ``open_rise``); ``band_only``:
    that, for a model whose draws are paired across variants (a comparison then reads the paired
    interval instead)."""

    predictable: bool
    reasons: list[Reason]  # each a kind and its numbers (``scalefit.reasons``), printed as its full text
    more_compute: float | None = None  # factor on the fitted compute the backtests suggest, if known
    error_only: bool = False
    band_only: bool = False

    @property
    def label(self) -> str:
        return "predictable" if self.predictable else "not yet predictable"

    def text(self) -> str:
        if self.predictable:
            return "predictable"
        out = "not yet predictable: " + "; ".join(self.reasons)
        if self.more_compute is not None:
            out += (
                f"; about {self.more_compute:.1f}x the fitted compute is likely needed before a prediction "
                "within the margin"
            )
        return out

    def short(self) -> str:
        """Why not yet predictable, in a few words: the first reason's short form (empty when predictable)."""
        return "" if self.predictable or not self.reasons else self.reasons[0].short()

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "predictable": self.predictable,
            "reasons": list(self.reasons),
            "more_compute": self.more_compute,
            "error_only": self.error_only,
        }


class CurveForecast(ABC):
    """What every forecast of a curve answers, however it was made: a fit over compute (``Forecast``)
    or laws across model size (``scalefit.sizes.SizeForecast``). Complete when built: its ``level`` and
    ``verdict``, the point curve, draws of the mean curve and of a new evaluation (the mean of ``n_runs``
    runs') and that band, each parameter's ``interval``, and itself as data. A caller holding one never asks which."""

    level: float
    verdict: Verdict

    @abstractmethod
    def point(self, compute) -> np.ndarray:
        """The predicted mean curve at each compute."""

    @abstractmethod
    def interval(self, param: str) -> tuple[float, float]:
        """``param``'s interval at ``level``."""

    @abstractmethod
    def mean_draws(self, compute) -> np.ndarray:
        """Draws of the mean curve at each compute: (draws, points)."""

    @abstractmethod
    def prediction_draws(self, compute, n_runs: int = 1) -> np.ndarray:
        """Draws of a new evaluation (the mean of ``n_runs`` runs') at each compute: (draws, points)."""

    @abstractmethod
    def prediction_band(self, compute, n_runs: int = 1, level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Where a new evaluation (the mean of ``n_runs`` runs') at each compute lands, at ``level``."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The forecast as data (JSON-ready)."""


@dataclass
class Forecast(CurveForecast):
    """A fit with its bands, backtests and verdict (see the module docstring). Bands are ``(lo, hi)``
    arrays at ``level``; ``no_band`` says why a forecast has none (its bands are NaN, no call)."""

    fit: CurveFit
    level: float
    noise: NoiseModel
    samples: np.ndarray  # (resamples, len(fit.sample_names)), e.g. A, B, C_mid, R0
    sigma_draws: np.ndarray  # (resamples,) noise level of each resample
    ratio: float
    margin: float
    backtests: list[Backtest] = field(default_factory=list)
    calibration: Calibration = field(default_factory=Calibration)  # what the backtests add to the spread
    verdict: Verdict | None = None
    seed: int = 0
    refitted_points: int | None = None  # fitted evaluations the bootstrap refitted (fewer when thinned)
    no_band: list[Reason] = field(default_factory=list)

    max_backtests: ClassVar[int]  # the latest feasible origins backtested
    backtest_resamples: ClassVar[int]  # resamples of each backtest's prefix forecast
    paired: ClassVar[bool] = False  # resample i of every variant comes from one simulated campaign
    error_name: ClassVar[str] = "backtest error"  # what ``expected_error`` is, in a decision's words

    # -- what each model answers its own way ---------------------------------------------------------
    @abstractmethod
    def interval(self, param: str) -> tuple[float, float]:
        """``param``'s interval at ``level`` from the resamples."""

    @abstractmethod
    def prediction_draws(self, compute, n_runs: int = 1) -> np.ndarray:
        """Draws of a new evaluation (the mean of ``n_runs`` runs') at each compute: (draws, points)."""

    @abstractmethod
    def target_draws(self, computes, n_runs: int = 1, window: int | None = None) -> np.ndarray:
        """Draws of the mean of ``n_runs`` runs' evaluations averaged over ``computes`` (``window``:
        the number of evaluations averaged; a mean over several needs it in ``mean_windows``)."""

    @property
    @abstractmethod
    def expected_error(self) -> float | None:
        """What the prediction at the target is expected to miss by (None: no estimate)."""

    @abstractmethod
    def expected_error_at(self, computes, n_runs: int | None = None, window: int | None = None) -> float:
        """Expected error of the prediction of the mean of ``n_runs`` runs over ``computes`` (NaN: no estimate)."""

    @abstractmethod
    def doubts(self) -> list[Reason]:
        """Why the fit cannot be trusted beyond its data, in the model's order (identification, too
        few backtests); empty when none."""

    @abstractmethod
    def error_doubt(self) -> tuple[Reason | None, float | None]:
        """The reason the expected error exceeds the margin (None when it does not), and the compute
        factor the errors' trend suggests (None: no estimate)."""

    @property
    def mean_windows(self) -> tuple[int, ...]:
        """Numbers of successive evaluations whose mean ``target_band`` can predict (none: one evaluation)."""
        return ()

    @property
    def p_within(self) -> float | None:
        """The probability that what the verdict is about (the seeds' mean at the target) lands within
        ±margin of the prediction; the verdict's *predictable* needs it >= ``level``. None: this model
        judges by its backtests' error instead (a variant fitted alone)."""
        return None

    def structure_doubts(self, design: CurveFit | None = None) -> list[Reason]:
        """Residual structure the curve does not explain (``design``: the points the noise was measured on)."""
        return []

    def unchecked_extrapolation(self, name: str) -> list[Reason]:
        """Why ``name``'s extrapolation is unchecked by backtests a call past the data needs (empty: checked)."""
        return []

    def own(self) -> Forecast:
        """The forecast from this variant's own data alone (itself unless it borrowed from others)."""
        return self

    def own_fit(self) -> CurveFit:
        """The fit to this variant's own data alone (``own().fit``, without resampling it)."""
        return self.fit

    def b_tie(self, candidate: Forecast, b_candidate: float) -> str | None:
        """How this (the baseline's) uncertainty cannot tell ``b_candidate`` (the candidate's B at the
        shared A) from its B, as a clause of the LOO verdict; None when it can."""
        lo, hi = self.interval(self.fit.parameters.efficiency[0])
        if lo <= b_candidate <= hi:
            return f", inside the baseline's {self.level:.0%} interval [{lo:.2f}, {hi:.2f}]"
        return None

    # -- written once --------------------------------------------------------------------------------
    def _curves(self, compute) -> tuple[np.ndarray, np.ndarray]:
        c = np.atleast_1d(np.asarray(compute, float))
        return c, self.fit.predict_batch(self.samples, c)

    def _nan(self, compute) -> tuple[np.ndarray, np.ndarray]:
        c = np.atleast_1d(np.asarray(compute, float))
        return np.full(len(c), np.nan), np.full(len(c), np.nan)

    def point(self, compute) -> np.ndarray:
        return self.fit.predict(np.atleast_1d(np.asarray(compute, float)))

    def _by_columns(self, compute, draws: int, band: Callable) -> tuple[np.ndarray, np.ndarray]:
        """``band(c)`` -> (lo, hi) over chunks of the compute values, at most ``BAND_CHUNK_FLOATS``
        draws x values each (one chunk for the few values a band is usually asked at)."""
        c = np.atleast_1d(np.asarray(compute, float))
        step = max(1, BAND_CHUNK_FLOATS // max(draws, 1))
        if len(c) <= step:
            return band(c)
        parts = [band(c[i : i + step]) for i in range(0, len(c), step)]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def confidence_band(self, compute) -> tuple[np.ndarray, np.ndarray]:
        """Where the mean curve lies: the fit's uncertainty with the backtests' shape error
        (``mean_draws``), no evaluation noise."""
        if self.no_band:
            return self._nan(compute)
        q = central_percentiles(self.level)

        def band(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            lo, hi = np.percentile(self.mean_draws(c), q, axis=0)
            return lo, hi + self.open_rise(c)

        return self._by_columns(compute, len(self.samples), band)

    def mean_draws(self, compute) -> np.ndarray:
        """Draws of the mean curve at each compute (resamples x points), with the backtests' shape
        error (``calibration``) as the prediction band has it: what the recipe itself reaches, not
        one evaluation."""
        c, curves = self._curves(compute)
        point = self.point(c)[None, :]
        return self.calibration.widen(point, curves - point, 0.0, c, float(self.fit.compute.max()), self.seed)

    def prediction_band(self, compute, n_runs: int = 1, level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Where a new evaluation at each compute lands (parameter uncertainty + evaluation noise +
        run-to-run deviation), calibrated by the backtests; at ``level`` (default the forecast's)."""
        if self.no_band:
            return self._nan(compute)
        q = central_percentiles(self.level if level is None else level)
        draws = len(self.samples) * max(1, -(-PREDICTION_DRAWS // len(self.samples)))

        def band(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            lo, hi = np.percentile(self.prediction_draws(c, n_runs), q, axis=0)
            return lo, hi + self.open_rise(c)

        return self._by_columns(compute, draws, band)

    def target_band(
        self, computes, n_runs: int = 1, level: float | None = None, window: int | None = None
    ) -> tuple[float, float]:
        """The central band of ``target_draws`` at ``level`` (default the forecast's; NaN with no band)."""
        if self.no_band:
            return np.nan, np.nan
        draws = self.target_draws(computes, n_runs, window)
        lo, hi = np.percentile(draws, central_percentiles(level or self.level))
        return float(lo), float(hi + self.open_rise(computes).mean())

    @cached_property
    def open_ceiling(self) -> OpenCeiling | None:
        """The ceiling left open by data that do not show their knee (``past_knee``); None where they
        do or the curve has no ceiling (a power law). Read once: the knee test and one refit."""
        if not self.fit.has_asymptote:
            return None
        k = knee(self)
        if k is not None and k.passed:
            return None
        own = self.own_fit()
        ceiling = own.parameters.ceiling
        top_a = float(own.parameters[ceiling].max)
        with warnings.catch_warnings():  # C_mid on its grid's top edge here only raises the bound it gives
            warnings.simplefilter("ignore", UserWarning)
            top = own.refit_fixed(ceiling, top_a)
        return OpenCeiling(top, top_a, k.text() if k is not None else "too few points to test for its knee")

    def open_rise(self, compute) -> np.ndarray:
        """How far above the fitted curve at each compute an open ceiling (``open_ceiling``) lets the
        curve rise past its data (0 within them, or where the data show the knee): the bands' upper
        edges and a call's interval move up by it, the draws' spread kept. Its draws bound the
        ceiling by the sigmoid's shape, not by the data (loo-gpu7's lr_quarter, fitted on half its
        budget, ended 7.5 of its band's standard deviations above it)."""
        c = np.atleast_1d(np.asarray(compute, float))
        past = c > float(self.fit.compute.max()) * (1 + 1e-9)
        if not past.any() or self.open_ceiling is None:
            return np.zeros(len(c))
        return np.where(past, np.maximum(self.open_ceiling.top(c) - self.point(c), 0.0), 0.0)

    def judge(self, design: CurveFit | None = None) -> Verdict:
        """The verdict: no band, or the model's doubts, then its error against the margin, then
        residual structure; each reason in numbers, with the compute likely needed where known."""
        if self.no_band:
            return Verdict(False, [Reason("no_band", parts=tuple(self.no_band))])
        reasons = self.doubts()
        identified = not reasons
        knee_doubt = self.knee_doubt()
        reasons += knee_doubt
        more = [m for m in (self.fit.more_compute(),) if m is not None]
        error, trend = self.error_doubt()
        if error is not None:
            reasons.append(error)
        if trend is not None:
            more.append(trend)
        reasons += self.structure_doubts(design)
        error_only = identified and bool(reasons) and len(reasons) == (error is not None) + len(knee_doubt)
        more_compute = max(more) if more and reasons else None
        return Verdict(not reasons, reasons, more_compute, error_only, error_only and self.paired)

    def knee_doubt(self) -> list[Reason]:
        """Past data that do not show their knee, where the open ceiling's rise (``open_rise``) at the
        forecast's target (``ratio`` x its data) passes the margin: the reason."""
        at = float(self.fit.compute.max()) * self.ratio
        if self.open_rise([at])[0] <= self.margin:
            return []
        oc = self.open_ceiling
        return [Reason("open_knee", {"ratio": self.ratio}, {"test": oc.why, "allows": oc.text(self, at)})]

    def at(self, compute, observed=None, n_runs: int = 1) -> list[dict[str, Any]]:
        """Point prediction and both bands at each compute value (with the observation, if given)."""
        c = np.atleast_1d(np.asarray(compute, float))
        p = self.point(c)
        clo, chi = self.confidence_band(c)
        plo, phi = self.prediction_band(c, n_runs)
        rows = []
        for i in range(len(c)):
            row = {
                "compute": float(c[i]),
                "predicted": float(p[i]),
                "confidence_band": [float(clo[i]), float(chi[i])],
                "prediction_band": [float(plo[i]), float(phi[i])],
            }
            if observed is not None:
                o = float(np.atleast_1d(observed)[i])
                row.update(observed=o, error=float(p[i] - o), in_prediction_band=bool(plo[i] <= o <= phi[i]))
            rows.append(row)
        return rows

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "level": self.level,
            "n_resamples": len(self.samples),
            "refitted_points": self.refitted_points,
            "noise": self.noise.to_dict(),
            "ratio": self.ratio,
            "shape_sd": self.calibration.shape_sd,
            "shape_backtests": self.calibration.backtests,
            "expected_error": self.expected_error,
            "backtests": [
                {
                    "origin": b.origin,
                    "target": b.target,
                    "predicted": b.predicted,
                    "observed": b.observed,
                    "error": b.error,
                    "error_at_ratio": b.scaled_error,
                }
                for b in self.backtests
            ],
            "verdict": self.verdict.to_dict() if self.verdict else None,
        }
        for p in self.fit.param_names:
            out[f"{p}_interval"] = list(self.interval(p))
        f = self.fit
        if len(f.heldout_compute):
            out["heldout"] = self.at(f.heldout_compute, f.heldout_value)
        return out


@dataclass
class CampaignForecast:
    """Every variant of a campaign fitted and forecast by one model, jointly or each alone: the
    result every campaign fit gives (``scalefit.forecasts.pooled.forecast_variants``), as lmfit's
    ``ModelResult`` is every model's."""

    fits: dict[str, CurveFit]
    forecasts: dict[str, Forecast]
    failed: dict[str, str]  # variant -> why it has no fit
    description: str  # how the campaign was fitted, in one line


# -- the call: a variant against the baseline at a budget, for every forecast ---------------------------
@dataclass
class Call:
    """A variant against the baseline at a budget, from the two forecasts' draws of the mean curve."""

    label: str  # worse | no difference | better | cannot tell yet
    delta: float  # predicted mean-curve difference, variant - baseline
    lo: float
    hi: float
    reason: str = ""
    reading: Separation | None = None  # ceiling or efficiency (``scalefit.forecasts.slower_or_lower``; sigmoids only)
    reasons: tuple[Reason, ...] = ()  # as data, where the call was not made for want of a fit to make it from
    unseparated: str = ""  # "slower or lower" / "faster or higher": what ``withhold`` left open (``UNSEPARATED``)

    def short(self) -> str:
        """Why no call, in a few words (its first reason's short form); empty where it has none as data."""
        return self.reasons[0].short() if self.reasons else ""

    def text(self, margin: float) -> str:
        if self.label == "cannot tell yet" and self.unseparated:
            return f"{self.unseparated}: cannot tell yet ({self.reason})"
        if self.label == "cannot tell yet" and self.reason:
            return f"cannot tell yet: {self.reason}"
        return f"{self.label}: Δ {self.delta:+.3f} [{self.lo:+.3f}, {self.hi:+.3f}]"


def extrapolates(fc: Forecast, at: float) -> bool:
    """Whether ``at`` lies past the forecast's fitted data."""
    return at > float(fc.fit.compute.max()) * (1 + 1e-9)


def unsupported(name: str, fc: Forecast, at: float, open_side: str = "") -> list[Reason]:
    """Why ``fc`` cannot carry a call at ``at`` (empty when it can): not identified, or, past its
    fitted data, an extrapolation unchecked by backtests (``Forecast.unchecked_extrapolation``) or
    whose asymptote it does not bound. ``open_side`` ("lower" / "upper"): the grid edge A may reach
    without overturning the call (a variant called better whose ceiling may be higher still);
    clipped there, its draws only understate the difference."""
    if fc.fit.not_identified:
        return [Reason("not_identified", words={"arm": name})]
    if not extrapolates(fc, at):
        return []
    why = fc.unchecked_extrapolation(name)
    ceiling = fc.fit.parameters.ceiling
    if ceiling is not None:  # a power law has no asymptote to bound, its A is not a ceiling
        a_lo, a_hi = fc.interval(ceiling)
        edges = (fc.fit.parameters[ceiling].min, fc.fit.parameters[ceiling].max)
        if (a_lo <= edges[0] + 1e-9 and open_side != "lower") or (a_hi >= edges[1] - 1e-9 and open_side != "upper"):
            why.append(Reason("asymptote", {"lo": a_lo, "hi": a_hi}, {"arm": name}))
    return why


def knee(fc: Forecast) -> Knee | None:
    """The knee test on the forecast's fitted points, the gain counted from its R0 (``knee_from_data``;
    None: too few to test). The fitted points hold no zero compute: without R0 the gain would be
    counted from the first evaluation, and a curve that rose before it would never read flat."""
    fit = fc.fit
    runs = None if fit.run_inputs is None or fit.used is None else fit.run_inputs[fit.used]
    return knee_from_data(fit.compute, fit.value, runs, start=fit.start_level)  # a power law has none


def past_knee(fc: Forecast) -> bool:
    """Whether the forecast's fitted points show its knee by the data alone (``knee_from_data``:
    the runs flatten in log C over the last doubling of the data), not by the fitted C_mid it tests."""
    k = knee(fc)
    return bool(k is not None and k.passed)


@dataclass(frozen=True)
class OpenCeiling:
    """How high a curve whose data do not show its knee may rise past them. A sigmoid still
    steepening has at least the gain ahead that it has made, so its fit's knee, if placed in its data
    (as one fitted before the knee tends to), can only have come too early: its ceiling is open
    upwards, up to where a sigmoid with the highest ceiling fitting its data takes it (``fit``: its
    own fit refitted with A at the top of its grid)."""

    fit: CurveFit
    ceiling: float  # the A ``fit`` was refitted at
    why: str  # the knee test, in words

    def top(self, compute) -> np.ndarray:
        return self.fit.predict(np.atleast_1d(np.asarray(compute, float)))

    def text(self, fc: Forecast, at: float) -> str:
        """What the open ceiling allows ``fc`` at ``at``."""
        top, point = float(self.top(at)[0]), float(fc.point([at])[0])
        return f"with a ceiling of {self.ceiling:.3f} it may reach {top:.3f}, not {point:.3f}"


def knee_bounded(call: Call, variant: Forecast, baseline: Forecast, at: tuple[float, float], margin: float) -> Call:
    """``call``, past the data, where it still holds with each arm whose data do not show its knee
    risen as far as its open ceiling lets it (a variant still steepening may yet rise to the
    baseline; a baseline still steepening may pull away from a variant level with it or ahead): its
    interval's end moved by that rise (``Forecast.open_rise``), as the bands' are; else "cannot tell
    yet" (slower or lower, for a variant behind), saying how far the open arm could go. Draws of a
    sigmoid fitted before its knee bound its ceiling by the model's shape, not by the data: a rate
    cut read at half its budget looks like a lower ceiling (loo-gpu7's lr_quarter)."""
    if call.label not in DECIDED:
        return call
    rise_v, rise_b = float(variant.open_rise([at[0]])[0]), float(baseline.open_rise([at[1]])[0])
    if rise_v == rise_b == 0.0:
        return call
    lo, hi = call.lo - rise_b, call.hi + rise_v
    side = against_margin(lo, hi, margin)
    label = {"within": "no difference", None: "cannot tell yet"}.get(side, side)
    if label == call.label:
        return Call(call.label, call.delta, lo, hi, call.reason, call.reading)
    said = [
        f"the {name}'s data do not show its knee ({fc.open_ceiling.why}): {fc.open_ceiling.text(fc, c)}"
        for name, fc, c, rise in (("variant", variant, at[0], rise_v), ("baseline", baseline, at[1], rise_b))
        if rise > 0
    ]
    why = f"{'; '.join(said)}; Δ then spans [{lo:+.3f}, {hi:+.3f}]; the fits alone say {call.text(margin)}"
    return withhold(Call(call.label, call.delta, lo, hi, call.reason, call.reading), why, open_ceiling=True)


def reading(variant: Forecast, baseline: Forecast, at: tuple[float, float], margin: float) -> Separation | None:
    """Ceiling against efficiency at ``at`` (``scalefit.forecasts.slower_or_lower.separate``); None for a
    curve with no band or no asymptote (a power law has no ceiling to read)."""
    pair = (variant, baseline)
    if any(fc.no_band or not fc.fit.has_asymptote for fc in pair):
        return None
    sep = separate(variant, baseline, at[0], at[1], margin=margin)
    if sep is None or (past_knee(variant) and past_knee(baseline)):
        return sep
    return replace(sep, ceiling_open=True)  # a ceiling its data have not bent towards is the model's guess


def withhold(call: Call, why: str, open_ceiling: bool = False) -> Call:
    """``call`` not made, for ``why``. Where a ceiling is open (``open_ceiling``: an own fit's A
    reaches its grid's edge) or its reading finds the efficiency changed and the ceiling not yet
    told, it is "slower or lower" ("faster or higher"): the difference at the budget could come from
    either, and the reading says what compute would tell them apart."""
    r = call.reading
    efficiency = r.efficiency if r is not None and r.ceiling == "cannot tell" else ""
    if (efficiency, call.delta < 0) not in (("slower", True), ("faster", False)):
        efficiency = ""  # a variant behind at the budget is not explained by its being faster, nor ahead by slower
    which = UNSEPARATED.get(call.label) or UNSEPARATED.get({"slower": "worse", "faster": "better"}.get(efficiency, ""))
    if not (which and (open_ceiling or efficiency in ("slower", "faster"))):
        return Call("cannot tell yet", call.delta, call.lo, call.hi, why, call.reading)
    told = ""
    if r is not None and r.ceiling == "cannot tell":
        lo, hi = r.delta_a_interval
        told = f"{r.efficiency_text()}, ceiling not yet told (ΔA {r.delta_a:+.3f} [{lo:+.3f}, {hi:+.3f}]); "
        told += f"{r.separation_text()}; "
    return Call("cannot tell yet", call.delta, call.lo, call.hi, told + why, call.reading, unseparated=which)


def label_call(variant: Forecast, baseline: Forecast, at: tuple[float, float], margin: float, level: float) -> Call:
    """The call from two forecasts' draws of the mean curve at ``at`` (the variant's budget, the
    baseline's), paired where they come from one simulated campaign. Where the draws centre off the
    point difference, its interval spans both readings of them: as they are, widened to hold the
    point (``interval_holding``), and moved onto it; a call needs both (widened alone, the draws of
    a slower variant centred below its point called "worse" where the moved ones did not)."""
    budget, bb = at
    v = variant.mean_draws([budget])[:, 0]
    b = baseline.mean_draws([bb])[:, 0]
    n = min(len(v), len(b))
    d = v[:n] - b[:n]
    delta = float(variant.point([budget])[0] - baseline.point([bb])[0])
    lo, hi = interval_holding(d, delta, level)
    moved = np.percentile(d - np.median(d) + delta, central_percentiles(level))
    lo, hi = min(lo, float(moved[0])), max(hi, float(moved[1]))
    side = against_margin(lo, hi, margin)
    return Call({"within": "no difference", None: "cannot tell yet"}.get(side, side), delta, lo, hi)


def backed(
    call: Call, variant: Forecast, baseline: Forecast, at: tuple[float, float], margin: float, level: float
) -> Call:
    """``call`` where the variant's own data back it, else "cannot tell yet" saying why: a call made
    past the data from a forecast that borrowed from other variants (``own()`` is another) stands
    when the variant is predictable or when the two fits, each alone, make the same call with their
    asymptotes bounded (a campaign's prior on B narrows B's draws, and bounds A through it, before a
    slower variant's B has diverged)."""
    budget, bb = at
    if call.label not in DECIDED or not (extrapolates(variant, budget) or extrapolates(baseline, bb)):
        return call
    verdict = variant.verdict
    if verdict is not None and verdict.predictable and past_knee(variant) and past_knee(baseline):
        return call  # a verdict's backtests speak for a curve past its knee, not for one still steepening
    own_v, own_b = variant.own(), baseline.own()
    if own_v is variant and own_b is baseline:  # nothing was pooled: the call is the own fits' already
        return call
    pooled = f"the joint fit says {call.text(margin)}"
    side = {"worse": ("lower", "upper"), "better": ("upper", "lower")}.get(call.label, ("", ""))
    why = unsupported("the variant's own fit", own_v, budget, side[0])
    why += unsupported("the baseline's own fit", own_b, bb, side[1])
    if why:
        if any(w.kind == "asymptote" for w in why) and call.label in UNSEPARATED:
            return withhold(call, f"{'; '.join(why)}; {pooled}", open_ceiling=True)
        return withhold(call, f"the variant's own fit does not back it: {'; '.join(why)}; {pooled}")
    own = label_call(own_v, own_b, at, margin, level)
    if own.label != call.label:
        return withhold(call, f"the variant's own fit does not back it: alone it says {own.text(margin)}; {pooled}")
    return call


def call_difference(
    variant: Forecast,
    baseline: Forecast,
    budget: float,
    baseline_budget: float | None = None,
    *,
    margin: float = DEFAULT_MARGIN,
    level: float = 0.95,
) -> Call:
    """worse / better when the whole interval of the mean-curve difference at the budget is beyond
    ∓margin, no difference when it is inside ±margin, else cannot tell yet. No call from a curve
    with no band or not identified, nor, at a budget past its fitted data (an extrapolation),
    from one whose extrapolation backtests have not checked (``MIN_BACKTESTS`` past the knee in a
    joint fit's campaign) or whose asymptote A the resamples do not bound (its interval reaches the
    grid's edge): such a difference is the fit's guess, not the data's. Past the data, a call from a
    forecast that borrowed from other variants also needs the variant's own data to back it (``backed``)."""
    pair = (("variant", variant), ("baseline", baseline))
    why = [Reason("arm_no_band", words={"arm": n}, parts=(fc.no_band[0],)) for n, fc in pair if fc.no_band]
    at = (budget, budget if baseline_budget is None else baseline_budget)
    for (n, fc), c in zip(pair, at, strict=True):
        if not fc.no_band:
            why += unsupported(n, fc, c)
    if why:
        return Call("cannot tell yet", np.nan, np.nan, np.nan, "; ".join(why), reasons=tuple(why))
    call = label_call(variant, baseline, at, margin, level)
    call.reading = reading(variant, baseline, at, margin)
    if call.label == "cannot tell yet":  # the interval straddles a margin: slower or lower, where the reading says
        withheld = withhold(call, f"Δ {call.delta:+.3f} [{call.lo:+.3f}, {call.hi:+.3f}] straddles ±{margin:g}")
        return withheld if withheld.unseparated else call
    return knee_bounded(backed(call, variant, baseline, at, margin, level), variant, baseline, at, margin)

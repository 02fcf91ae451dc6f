"""Honest predictions of one curve fitted alone (``SingleForecast``, a ``scalefit.forecasts.interface.Forecast``):
a confidence band, a calibrated prediction band, backtests and a verdict.

``forecast(fit)`` answers "where will an evaluation at compute C land, and can I trust that?":

1. **Noise model** (``NoiseModel``). The residuals of each run are one series, not iid points:
   their variance (at least the evaluation's own binomial variance when the caller gives its
   size) and their lag-1 correlation (bias-corrected for short series) describe an AR(1)
   deviation of each run from the mean curve; that holds evaluation noise, slow drift of the
   policy and, with several runs, run-to-run offsets.
2. **Correlated parametric bootstrap.** Each resample draws a new noise level (its posterior
   given the residual degrees of freedom), an AR(1) deviation series per run — starting at the
   zero-compute evaluation, so R0 is uncertain too — and refits A, B and C_mid. The spread of
   the refitted curves is the **confidence band** (the mean curve); adding a new evaluation's
   deviation gives the **prediction band** (where an observation lands).
3. **Backtests** (rolling origin). Earlier prefixes of the same data are fitted and asked to
   predict later known points at the same extrapolation ratio as the real question. Their
   standardised errors calibrate the prediction band (its width is scaled by their pooled
   RMS, split-conformal style, with a prior weight so two backtests cannot shrink it to
   nothing) and their raw errors give the **expected extrapolation error** of this curve.
4. **Verdict.** ``predictable`` or ``not yet predictable``, with every reason in numbers: too
   few points to backtest, the knee not reached, A or C_mid on a grid edge, backtest error
   above the comparison margin, residuals the sigmoid does not explain. When not predictable,
   how much more compute the backtests suggest before a ±margin prediction becomes likely.

Memory and time are bounded for any number of points and runs: beyond ``FORECAST_POINTS``
fitted evaluations, the bootstrap and the backtests refit every k-th evaluation of each run
(``thin_runs``; the point fit keeps every point), and the resamples are refitted in chunks of
at most ``BOOT_CHUNK_FLOATS`` resamples × points (``correlated_bootstrap``), bands computed in
chunks of compute values. docs/scalefit.md states the rule and what it costs.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from scalefit.defaults import DEFAULT_LEVEL, DEFAULT_MARGIN
from scalefit.errors import FitError
from scalefit.forecasts.interface import (
    DEFAULT_RATIO,
    MIN_BACKTESTS,
    PREDICTION_DRAWS,
    STRUCTURE_Z,
    Backtest,
    Forecast,
    NoiseModel,
    Verdict,
    backtest_target,
    calibrate,
    error_trend,
    score_backtest,
)
from scalefit.forecasts.settings import FitSettings
from scalefit.forecasts.uncertainty import central_percentiles
from scalefit.models.base import CurveFit
from scalefit.models.registry import make_model
from scalefit.models.sigmoid import KNEE_SHARE, MIN_POINTS, chunks
from scalefit.reasons import Reason

PHI_MAX = 0.95
__all__ = [
    "KNEE_SHARE",
    "Backtest",
    "Forecast",
    "NoiseModel",
    "SingleForecast",
    "Verdict",
    "fit_and_forecast",
    "forecast",
]
DEBIAS_ROUNDS = 3
FORECAST_POINTS = 2000  # the most fitted evaluations the bootstrap and backtests refit; beyond, runs are thinned
MIN_RUN_POINTS = 8  # a thinned run keeps at least this many (many short runs: the bound is per run, not total)
BOOT_CHUNK_FLOATS = 2_500_000  # resamples x points per refitted chunk (20 MB per array, ~350 MB at peak)
MAX_RESAMPLES = 100_000


def eval_sd(p, eval_prompts: int | None, eval_samples: int = 16) -> np.ndarray | None:
    """Sampling sd of mean@k over ``eval_prompts`` prompts at pass rate p (binomial, an upper bound:
    differences between prompts only lower it)."""
    if not eval_prompts:
        return None
    p = np.clip(np.asarray(p, float), 0.0, 1.0)
    return np.sqrt(p * (1.0 - p) / (eval_prompts * eval_samples))


def run_series(fit: CurveFit) -> list[np.ndarray]:
    """Indices into the fit's inputs of each run's evaluations in compute order, zero compute included."""
    c_all, _ = fit.inputs
    idx = np.flatnonzero(fit.series_mask())
    idx = idx[np.lexsort((c_all[idx], fit.run_inputs[idx]))]  # by run, then compute; ties keep input order
    runs = fit.run_inputs[idx]
    uniq = np.unique(fit.run_inputs)  # every run, one with no point here included (an empty series)
    lo, hi = np.searchsorted(runs, uniq, "left"), np.searchsorted(runs, uniq, "right")
    return [idx[a:b] for a, b in zip(lo, hi, strict=True)]


def _every_kth(n: int, k: int) -> np.ndarray:
    """Positions of ``k`` of ``n`` evaluations evenly spaced in their order (about every n/k-th,
    the first and the last kept); all of them when ``n <= k``."""
    if n <= k:
        return np.arange(n)
    return np.unique(np.round(np.linspace(0, n - 1, k)).astype(int))


def thin_runs(fit: CurveFit, max_points: int | None = None) -> CurveFit:
    """The evaluations the bootstrap and the backtests refit: the fit itself when it has at most
    ``max_points`` (default ``FORECAST_POINTS``) fitted points; otherwise a copy (same A, B, C_mid,
    R0, grids) in which each run keeps ``max(MIN_RUN_POINTS, max_points // runs)`` of its fitted
    evaluations, evenly spaced in compute order (``_every_kth``), and its zero-compute evaluation.

    The kept evaluations are real ones, not averages, so the noise model still describes one
    evaluation, and they spread over compute as the full data do, so the refits are the same
    least-squares estimator on fewer points: its spread is as wide as the full data's or wider
    (wider by up to the square root of the thinning when successive evaluations are independent,
    about the same when runs drift or R0's uncertainty dominates). Thinning evenly in log-compute
    instead moves the weight towards the rise and narrowed C_mid's interval by 30-40% below the
    full data's in the measured case (docs/scalefit.md).
    """
    max_points = FORECAST_POINTS if max_points is None else max_points
    if int(fit.used.sum()) <= max_points:
        return fit
    c_all, v_all = fit.inputs
    series = run_series(fit)
    per_run = max(MIN_RUN_POINTS, max_points // max(len(series), 1))
    keep = []
    for idx in series:
        fitted = idx[fit.used[idx]]
        keep += [idx[~fit.used[idx]], fitted[_every_kth(len(fitted), per_run)]]
    keep = np.sort(np.concatenate(keep))
    used = fit.used[keep]
    c, v = c_all[keep], v_all[keep]
    empty = np.empty(0)
    return replace(
        fit,
        compute=c[used],
        value=v[used],
        inputs=(c, v),
        used=used,
        run_inputs=fit.run_inputs[keep],
        heldout_compute=empty,
        heldout_value=empty,
    )


def _residual_stats(resid: np.ndarray, series: list[np.ndarray], n_free: int) -> tuple[np.ndarray, np.ndarray]:
    """Variance (per residual degree of freedom) and pooled lag-1 correlation of residual series.

    ``resid`` is (rows, points); each entry of ``series`` indexes one run's points in order.
    """
    resid = np.atleast_2d(resid)
    used = np.concatenate(series)
    n = len(used)
    sse = np.einsum("rn,rn->r", resid[:, used], resid[:, used])
    num = sum(np.einsum("rn,rn->r", resid[:, i[1:]], resid[:, i[:-1]]) for i in series if len(i) > 1)
    den = sum(np.einsum("rn,rn->r", resid[:, i[:-1]], resid[:, i[:-1]]) for i in series if len(i) > 1)
    phi = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
    return sse / max(n - n_free, 1), phi


def noise_model(fit: CurveFit, eval_prompts: int | None = None, eval_samples: int = 16) -> NoiseModel:
    """First estimate of the runs' AR(1) deviation from the fitted curve, from its residuals
    (``forecast`` then removes the bias that fitting puts into it)."""
    c_all, v_all = fit.inputs
    resid = v_all - fit.predict(c_all)
    series = run_series(fit)
    var, phi = _residual_stats(resid[None, :], series, fit.n_free)
    n = sum(len(i) for i in series)
    sd_eval = eval_sd(fit.predict(fit.compute), eval_prompts, eval_samples)
    sigma_eval = float(np.sqrt(np.mean(sd_eval**2))) if sd_eval is not None else None
    sigma2 = float(var[0]) if sigma_eval is None else max(float(var[0]), sigma_eval**2)
    return NoiseModel(
        float(np.sqrt(sigma2)), float(np.clip(phi[0], 0.0, PHI_MAX)), max(n - fit.n_free, 1), sigma_eval, len(series)
    )


def _effective_dof(noise: NoiseModel) -> float:
    """Degrees of freedom behind sigma when successive deviations are correlated (at least 3)."""
    n = noise.dof + 3
    return max(3.0, n * (1.0 - noise.phi) / (1.0 + noise.phi) - 3.0)


@dataclass
class SingleForecast(Forecast):
    """One curve's forecast from its own fit (any curve model): the correlated bootstrap's bands,
    its own rolling-origin backtests, and its verdict (``Forecast``)."""

    max_backtests: ClassVar[int] = 6  # a lone curve's prefixes are cheap to refit: the latest six origins
    backtest_resamples: ClassVar[int] = 150

    def interval(self, param: str) -> tuple[float, float]:
        """The resamples' central interval of ``param`` at ``level``."""
        lo, hi = np.percentile(self.samples[:, self.fit.sample_names.index(param)], central_percentiles(self.level))
        return float(lo), float(hi)

    def prediction_draws(self, compute, n_runs: int = 1) -> np.ndarray:
        """Draws of a new evaluation at each compute (the mean of ``n_runs`` runs' evaluations),
        around the point prediction, with the backtests' shape error (``calibration``). Each parameter draw gets
        several deviation draws (at least ``PREDICTION_DRAWS`` in all), so few resamples still give
        a smooth band."""
        c, curves = self._curves(compute)
        reps = max(1, -(-PREDICTION_DRAWS // len(curves)))
        curves = np.repeat(curves, reps, axis=0)
        sigma = np.repeat(self.sigma_draws, reps)
        rng = np.random.default_rng(self.seed + 1)
        dev = rng.standard_normal(curves.shape) * sigma[:, None] / np.sqrt(max(n_runs, 1))
        point = self.point(c)[None, :]
        return self.calibration.widen(point, curves - point, dev, c, float(self.fit.compute.max()), self.seed)

    def target_draws(self, computes, n_runs: int = 1, window: int | None = None) -> np.ndarray:
        """``prediction_draws`` at one compute: a lone fit's noise model is one evaluation's, so it
        predicts no mean over several evaluations (``mean_windows`` is empty)."""
        c = np.atleast_1d(np.asarray(computes, float))
        if len(c) != 1 or (window or 1) != 1:
            raise ValueError("a single fit's noise model is one evaluation's: no band for a mean over several")
        return self.prediction_draws(c, n_runs)[:, 0]

    @property
    def expected_error(self) -> float | None:
        """Expected error of the predicted mean curve at this extrapolation ratio: the backtests'
        RMS error carried to the ratio, less the noise of what each was scored on (the mean of k
        runs' evaluations: sigma^2 / k) (None without backtests)."""
        if not self.backtests:
            return None
        s2 = self.noise.sigma**2
        return float(
            np.sqrt(np.mean([max(b.error**2 - s2 / b.n_runs, 0.0) * b.reach_factor**2 for b in self.backtests]))
        )

    def expected_error_at(self, computes, n_runs: int | None = None, window: int | None = None) -> float:
        """NaN: the backtests score the mean curve at the question's ratio (``expected_error``), not a
        k-run mean at any compute."""
        return float("nan")

    def doubts(self) -> list[Reason]:
        """Too few backtests, then the model's own identification (knee, grid edges, bounds)."""
        out = []
        if len(self.backtests) < MIN_BACKTESTS:
            n = {"n": len(self.backtests), "points": self.fit.n_points, "need": MIN_BACKTESTS, "ratio": self.ratio}
            out.append(Reason("backtests", n))
        return out + self.fit.identified()

    def error_doubt(self) -> tuple[Reason | None, float | None]:
        """The backtests' expected error above the margin, and where their trend reaches it."""
        err = self.expected_error
        if err is None or err <= self.margin:
            return None, None
        text = Reason("error", {"error": err, "ratio": self.ratio, "margin": self.margin})
        return text, error_trend(self.backtests, self.margin, float(self.fit.compute.max()))

    def structure_doubts(self, design: CurveFit | None = None) -> list[Reason]:
        """The latest third of the points off the curve by more than ``STRUCTURE_Z`` standard errors."""
        z = _structure(self.fit if design is None else design, self.noise)
        if abs(z) <= STRUCTURE_Z:
            return []
        return [Reason("structure", {"z": z}, {"form": "points", "model": self.fit.name.replace("_", " ")})]


def correlated_bootstrap(
    fit: CurveFit, noise: NoiseModel, n_resamples: int, seed: int = 0, *, draw_sigma: bool = True
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Parameter draws (A, B, C_mid, R0) from refitting simulated data: AR(1) deviations per run
    around the fitted curve, with the noise level drawn from its posterior (``draw_sigma``).

    Also returns each resample's noise level and the residual statistics of its refit (variance
    and lag-1 correlation, as ``noise_model`` measures them on the real data).

    The resamples are simulated and refitted in chunks of at most ``BOOT_CHUNK_FLOATS`` resamples
    × points, one after another from the one generator, so memory is bounded for any size. The
    chunking depends only on the number of points, so a seed gives the same draws every time;
    where all resamples fit in one chunk they are the draws of one unchunked pass.
    """
    rng = np.random.default_rng(seed)
    c_all, _ = fit.inputs
    series = run_series(fit)
    if draw_sigma:
        dof = _effective_dof(noise)
        sigma = noise.sigma * np.sqrt(dof / rng.chisquare(dof, size=n_resamples))
    else:
        sigma = np.full(n_resamples, noise.sigma)
    parts = [
        _refit_chunk(fit, noise, series, sigma[part], rng)
        for part in chunks(n_resamples, len(c_all), BOOT_CHUNK_FLOATS)
    ]
    samples, var, phi = (np.concatenate(x) for x in zip(*parts, strict=True))
    return samples, sigma, (var, phi)


def _refit_chunk(
    fit: CurveFit, noise: NoiseModel, series: list[np.ndarray], sigma: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Simulate and refit ``len(sigma)`` resamples: their draws (``fit.sample_names``) and residual
    statistics; the refits are the model's own (``fit.refit_batch``)."""
    from scipy.signal import lfilter  # here: scipy.signal takes ~0.8 s to import, which every CLI paid

    n_resamples = len(sigma)
    c_all, _ = fit.inputs
    dev = np.zeros((n_resamples, len(c_all)))
    innov = np.sqrt(1.0 - noise.phi**2)
    for idx in series:
        z = rng.standard_normal((n_resamples, len(idx)))
        z[:, 1:] *= innov  # e_0 = z_0 (stationary start), e_t = phi e_(t-1) + innov z_t
        dev[:, idx] = lfilter([1.0], [1.0, -noise.phi], z, axis=1) * sigma[:, None]
    with np.errstate(invalid="ignore"):  # points outside every series (e.g. a power law's zero compute)
        sim = fit.predict(c_all)[None, :] + dev
        samples = fit.refit_batch(sim)
        resid = sim - fit.predict_batch(samples, c_all)
    var, phi = _residual_stats(resid, series, fit.n_free)
    return samples, var, phi


def _debiased_noise(fit: CurveFit, raw: NoiseModel, n_resamples: int, seed: int) -> NoiseModel:
    """Undo what fitting does to the residuals (parametric-bootstrap bias correction).

    A fitted curve follows slow drift, so the residuals' variance and lag-1 correlation
    understate the runs' real deviation. Simulate the current estimate, refit, and measure both
    statistics as on the real residuals; move the estimate by the shortfall and repeat
    (``DEBIAS_ROUNDS`` times: indirect inference).
    """
    if raw.sigma <= 0:
        return raw
    sigma, phi = raw.sigma, float(np.clip(raw.phi + (1.0 + 3.0 * raw.phi) * raw.n_runs / (raw.dof + 3), 0.0, PHI_MAX))
    for k in range(DEBIAS_ROUNDS):
        trial = NoiseModel(sigma, phi, raw.dof, raw.sigma_eval, raw.n_runs)
        _, _, (var_sim, phi_sim) = correlated_bootstrap(fit, trial, n_resamples, seed + 7 + k, draw_sigma=False)
        sigma *= raw.sigma / max(float(np.sqrt(np.mean(var_sim))), 0.05 * raw.sigma)
        phi = float(np.clip(phi + (raw.phi - float(np.mean(phi_sim))), 0.0, PHI_MAX))
    if raw.sigma_eval is not None:
        sigma = max(sigma, raw.sigma_eval)
    return NoiseModel(float(sigma), phi, raw.dof, raw.sigma_eval, raw.n_runs)


def _target_ratio(fit: CurveFit, target: float | None) -> float:
    c_fit = float(fit.compute.max())
    if target is not None:
        return max(float(target) / c_fit, 1.0)
    if len(fit.heldout_compute):
        return max(float(fit.heldout_compute.max()) / c_fit, 1.0)
    return DEFAULT_RATIO


def _backtests(fc: SingleForecast, design: CurveFit, eval_prompts: int | None, eval_samples: int) -> list[Backtest]:
    """Fit prefixes of ``design`` ending at earlier evaluations and score each on the farthest
    fitted point within the question's ratio x its compute (``backtest_target``); the latest
    feasible origins, at most ``SingleForecast.max_backtests``."""
    c_all, v_all = design.inputs
    c_fit, v_fit = c_all[design.used], v_all[design.used]
    origins = [float(o) for o in np.unique(c_fit)[MIN_POINTS - 1 :] if backtest_target(c_fit, o, fc.ratio)]
    out = []
    for o in origins[-fc.max_backtests :]:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                prefix = design.prefix(o)
            pfc = forecast(
                prefix,
                level=fc.level,
                eval_prompts=eval_prompts,
                eval_samples=eval_samples,
                n_resamples=fc.backtest_resamples,
                seed=fc.seed,
                backtest=False,
            )
        except FitError:
            continue
        out.append(score_backtest(pfc, o, c_fit, v_fit, fc.ratio))
    return out


def _structure(fit: CurveFit, noise: NoiseModel) -> float:
    """z-score of the mean residual over the last third of the fitted points (AR(1)-adjusted)."""
    order = np.argsort(fit.compute, kind="stable")
    resid = (fit.value - fit.predict(fit.compute))[order]
    m = max(2, len(resid) // 3)
    tail = resid[-m:]
    per_run = m / max(noise.n_runs, 1)
    inflate = (1 + noise.phi) / (1 - noise.phi) if per_run > 1 else 1.0
    se = noise.sigma * np.sqrt(min(inflate, per_run) / m) if noise.sigma > 0 else np.inf
    return float(np.mean(tail) / se) if se > 0 else 0.0


def forecast(
    fit: CurveFit,
    *,
    level: float = DEFAULT_LEVEL,
    target: float | None = None,
    eval_prompts: int | None = None,
    eval_samples: int = 16,
    margin: float = DEFAULT_MARGIN,
    n_resamples: int = 1000,
    seed: int = 0,
    backtest: bool = True,
) -> SingleForecast:
    """Bands, backtests and the predictability verdict of a fit.

    level: coverage of the bands (0.9 by default). target: the compute the prediction is for
      (default: the last held-out point, else 2x the fitted compute); it sets the extrapolation
      ratio of the backtests. eval_prompts / eval_samples: the evaluation's size (mean@16 over
      1,000 prompts: 1000, 16), a floor under the estimated noise. margin: the comparison margin
      a prediction should be within (the paper's ±0.02).
    """
    if not 0.0 < level < 1.0:
        raise FitError(f"level must lie in (0, 1), got {level}")
    if n_resamples < 20:
        raise FitError(f"n_resamples must be at least 20, got {n_resamples}")
    if eval_prompts is not None and eval_prompts < 1:
        raise FitError(f"eval_prompts must be a positive number of prompts, got {eval_prompts}")
    if n_resamples > MAX_RESAMPLES:
        raise FitError(f"n_resamples must be at most {MAX_RESAMPLES:,}, got {n_resamples:,}")
    design = thin_runs(fit)  # the fit itself unless it has more than FORECAST_POINTS fitted points
    noise = _debiased_noise(
        design, noise_model(design, eval_prompts, eval_samples), min(max(n_resamples // 4, 50), 100), seed
    )
    samples, sigma_draws, _ = correlated_bootstrap(design, noise, n_resamples, seed)
    ratio = _target_ratio(fit, target)
    fc = SingleForecast(
        fit, level, noise, samples, sigma_draws, ratio, margin, seed=seed, refitted_points=design.n_points
    )
    if not backtest:
        return fc
    fc.backtests = _backtests(fc, design, eval_prompts, eval_samples)
    fc.calibration = calibrate(fc.backtests)
    fc.verdict = fc.judge(design)
    return fc


def fit_and_forecast(
    compute,
    value,
    settings: FitSettings | None = None,
    *,
    runs=None,
    fit_upto: float | None = None,
    target: float | None = None,
    n_resamples: int = 1000,
) -> tuple[CurveFit, SingleForecast]:
    """Fit one recipe's curve with ``settings``' model, grid, ``exclude_below``, level, margin and
    evaluation size (a campaign's ``FitSettings``; None: the library's defaults and the model's own
    grid), several runs pooled, each its own correlated series, and forecast it. The fit's warnings
    stay on the fit (``CurveFit.warnings``), not on the console."""
    s = settings or FitSettings()
    a_grid = s.a_values if settings is not None else None
    est = make_model(s.model, exclude_below=s.exclude_below, fit_upto=fit_upto, a_grid=a_grid)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = est.fit(compute, value, runs=runs).result_
    fc = forecast(
        f, level=s.level, target=target, eval_prompts=s.eval_prompts, margin=s.margin, n_resamples=n_resamples
    )
    return f, fc

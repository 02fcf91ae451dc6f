"""Honest predictions: a confidence band, a calibrated prediction band, backtests and a verdict.

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
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from scalefit.defaults import DEFAULT_LEVEL, DEFAULT_MARGIN
from scalefit.errors import FitError
from scalefit.fit import KNEE_SHARE, MIN_POINTS
from scalefit.model import CurveFit, CurveModel
from scalefit.models import make_model
from scalefit.uncertainty import central_percentiles

DEFAULT_RATIO = 2.0  # the paper's LOO practice: fit to 8k GPU-h, extrapolate to 16k
PHI_MAX = 0.95
__all__ = ["KNEE_SHARE", "Forecast", "Verdict", "fit_and_forecast", "forecast"]
CALIBRATION_PRIOR = 2.0  # weight of "the model's own band is right" against the backtests
MAX_BACKTESTS = 6
BACKTEST_RESAMPLES = 150
STRUCTURE_Z = 3.0
DEBIAS_ROUNDS = 3
PREDICTION_DRAWS = 4000
FORECAST_POINTS = 2000  # the most fitted evaluations the bootstrap and backtests refit; beyond, runs are thinned
MIN_RUN_POINTS = 8  # a thinned run keeps at least this many (many short runs: the bound is per run, not total)
BOOT_CHUNK_FLOATS = 2_500_000  # resamples x points per refitted chunk (20 MB per array, ~350 MB at peak)
BAND_CHUNK_FLOATS = 2_000_000  # draws x compute values per chunk of a band
MAX_RESAMPLES = 100_000


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


def eval_sd(p, eval_prompts: int | None, eval_samples: int = 16) -> np.ndarray | None:
    """Sampling sd of mean@k over ``eval_prompts`` prompts at pass rate p (binomial, an upper bound:
    differences between prompts only lower it)."""
    if not eval_prompts:
        return None
    p = np.clip(np.asarray(p, float), 0.0, 1.0)
    return np.sqrt(p * (1.0 - p) / (eval_prompts * eval_samples))


def _series(fit: CurveFit) -> list[np.ndarray]:
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
    series = _series(fit)
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
    series = _series(fit)
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
class Backtest:
    """One rolling-origin backtest: fitted up to ``origin``, scored on the later fitted points."""

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


@dataclass
class Verdict:
    predictable: bool
    reasons: list[str]
    more_compute: float | None = None  # factor on the fitted compute the backtests suggest, if known
    error_only: bool = False  # identified (knee reached, no grid edge, no structure); only its backtest error > margin

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "predictable": self.predictable,
            "reasons": list(self.reasons),
            "more_compute": self.more_compute,
            "error_only": self.error_only,
        }


@dataclass
class Forecast:
    """A fit with its bands, backtests and verdict. Bands are ``(lo, hi)`` arrays at ``level``."""

    fit: CurveFit
    level: float
    noise: NoiseModel
    samples: np.ndarray  # (resamples, len(fit.sample_names)), e.g. A, B, C_mid, R0, from the correlated bootstrap
    sigma_draws: np.ndarray  # (resamples,) noise level of each resample
    ratio: float
    margin: float
    backtests: list[Backtest] = field(default_factory=list)
    calibration: float = 1.0  # the prediction band's width factor from the backtests
    verdict: Verdict | None = None
    seed: int = 0
    refitted_points: int | None = None  # fitted evaluations the bootstrap refitted (fewer when thinned)

    def _curves(self, compute) -> tuple[np.ndarray, np.ndarray]:
        c = np.atleast_1d(np.asarray(compute, float))
        return c, self.fit.predict_batch(self.samples, c)

    def interval(self, param: str) -> tuple[float, float]:
        lo, hi = np.percentile(self.samples[:, self.fit.sample_names.index(param)], central_percentiles(self.level))
        return float(lo), float(hi)

    def point(self, compute) -> np.ndarray:
        return self.fit.predict(np.atleast_1d(np.asarray(compute, float)))

    def _by_columns(self, compute, draws: int, band) -> tuple[np.ndarray, np.ndarray]:
        """``band(c)`` -> (lo, hi) over chunks of the compute values, at most ``BAND_CHUNK_FLOATS``
        draws x values each (one chunk for the few values a band is usually asked at)."""
        c = np.atleast_1d(np.asarray(compute, float))
        step = max(1, BAND_CHUNK_FLOATS // max(draws, 1))
        if len(c) <= step:
            return band(c)
        parts = [band(c[i : i + step]) for i in range(0, len(c), step)]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def confidence_band(self, compute) -> tuple[np.ndarray, np.ndarray]:
        """Where the mean curve lies (parameter uncertainty only)."""
        q = central_percentiles(self.level)

        def band(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            lo, hi = np.percentile(self._curves(c)[1], q, axis=0)
            return lo, hi

        return self._by_columns(compute, len(self.samples), band)

    def mean_draws(self, compute) -> np.ndarray:
        """Draws of the mean curve at each compute (resamples x points), widened by the backtest
        calibration as the prediction band is: what the recipe itself reaches, not one evaluation."""
        c, curves = self._curves(compute)
        point = self.point(c)[None, :]
        return point + self.calibration * (curves - point)

    def prediction_draws(self, compute, n_runs: int = 1) -> np.ndarray:
        """Draws of a new evaluation at each compute (the mean of ``n_runs`` runs' evaluations),
        around the point prediction, scaled by the backtest calibration. Each parameter draw gets
        several deviation draws (at least ``PREDICTION_DRAWS`` in all), so few resamples still give
        a smooth band."""
        c, curves = self._curves(compute)
        reps = max(1, -(-PREDICTION_DRAWS // len(curves)))
        curves = np.repeat(curves, reps, axis=0)
        sigma = np.repeat(self.sigma_draws, reps)
        rng = np.random.default_rng(self.seed + 1)
        dev = rng.standard_normal(curves.shape) * sigma[:, None] / np.sqrt(max(n_runs, 1))
        point = self.point(c)[None, :]
        return point + self.calibration * (curves + dev - point)

    def prediction_band(self, compute, n_runs: int = 1, level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Where a new evaluation at each compute lands (parameter uncertainty + evaluation noise +
        run-to-run deviation), calibrated by the backtests; at ``level`` (default the forecast's)."""
        q = central_percentiles(self.level if level is None else level)
        draws = len(self.samples) * max(1, -(-PREDICTION_DRAWS // len(self.samples)))

        def band(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            lo, hi = np.percentile(self.prediction_draws(c, n_runs), q, axis=0)
            return lo, hi

        return self._by_columns(compute, draws, band)

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
            "calibration": self.calibration,
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


def _chunks(n: int, per_item: int) -> list[slice]:
    """Slices of ``range(n)`` of at most ``max(1, BOOT_CHUNK_FLOATS // per_item)`` items."""
    step = max(1, BOOT_CHUNK_FLOATS // max(per_item, 1))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


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
    series = _series(fit)
    if draw_sigma:
        dof = _effective_dof(noise)
        sigma = noise.sigma * np.sqrt(dof / rng.chisquare(dof, size=n_resamples))
    else:
        sigma = np.full(n_resamples, noise.sigma)
    parts = [_refit_chunk(fit, noise, series, sigma[part], rng) for part in _chunks(n_resamples, len(c_all))]
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


def _backtests(fit: CurveFit, ratio: float, level: float, eval_prompts, eval_samples, seed: int) -> list[Backtest]:
    """Fit prefixes ending at earlier evaluations and predict the farthest fitted point within
    ``ratio`` x the prefix's compute. A backtest must look at least sqrt(ratio) ahead (half the
    question's distance in log-compute); the latest feasible origins, at most ``MAX_BACKTESTS``."""
    c_all, v_all = fit.inputs
    c_fit, v_fit = c_all[fit.used], v_all[fit.used]
    feasible = []  # (origin, farthest fitted point within ratio x)
    for o in np.unique(c_fit)[MIN_POINTS - 1 :]:
        ahead = c_fit[(c_fit > o * (1 + 1e-12)) & (c_fit <= o * ratio * (1 + 1e-9))]
        if len(ahead) and ahead.max() >= o * np.sqrt(ratio) * (1 - 1e-9):
            feasible.append((float(o), float(ahead.max())))
    feasible = feasible[-MAX_BACKTESTS:]
    out = []
    for o, t in feasible:
        at_t = v_fit[c_fit == t]  # one evaluation per run there: their mean has sigma^2 / k
        observed = float(at_t.mean())
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                prefix = fit.prefix(o)
            fc = forecast(
                prefix,
                level=level,
                eval_prompts=eval_prompts,
                eval_samples=eval_samples,
                n_resamples=BACKTEST_RESAMPLES,
                seed=seed,
                backtest=False,
            )
        except FitError:
            continue
        draws = fc.prediction_draws([t], n_runs=len(at_t))[:, 0]
        out.append(Backtest(o, t, float(fc.point([t])[0]), observed, float(np.std(draws)), ratio, len(at_t)))
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


def _verdict(fc: Forecast, design: CurveFit | None = None) -> Verdict:
    """``design``: the evaluations the noise model was measured on (``thin_runs``), where the
    residual structure is judged with that noise model; default the fit itself."""
    f = fc.fit
    reasons = []
    c_fit = float(f.compute.max())
    more = []
    if len(fc.backtests) < 2:
        reasons.append(
            f"too few points to backtest a {fc.ratio:.2g}x extrapolation ({len(fc.backtests)} backtest(s) from "
            f"{f.n_points} fitted points; need 2, each looking at least {np.sqrt(fc.ratio):.2g}x ahead)"
        )
    reasons += f.identified()  # the model's own answer (the sigmoid's: knee reached, no grid edge or bound)
    if f.more_compute() is not None:
        more.append(f.more_compute())
    identified = not reasons
    err = fc.expected_error
    error_reason = err is not None and err > fc.margin
    if error_reason:
        reasons.append(f"backtest error {err:.3f} at {fc.ratio:.2g}x > margin {fc.margin}")
        trend = _error_trend(fc.backtests, fc.margin, c_fit)
        if trend is not None:
            more.append(trend)
    z = _structure(f if design is None else design, fc.noise)
    if abs(z) > STRUCTURE_Z:
        way = "above" if z > 0 else "below"
        reasons.append(
            f"the latest third of the points lies {way} the fitted curve (z = {z:+.1f}): structure the "
            f"{f.name.replace('_', ' ')} does not explain"
        )
    error_only = identified and error_reason and len(reasons) == 1
    return Verdict(not reasons, reasons, max(more) if more and reasons else None, error_only)


def _error_trend(backtests: list[Backtest], margin: float, c_fit: float) -> float | None:
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
) -> Forecast:
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
    fc = Forecast(fit, level, noise, samples, sigma_draws, ratio, margin, seed=seed, refitted_points=design.n_points)
    if not backtest:
        return fc
    fc.backtests = _backtests(design, ratio, level, eval_prompts, eval_samples, seed)
    zs = np.array([b.z for b in fc.backtests if np.isfinite(b.z)])
    # Only ever widen: backtests that happen to land close cannot make the model's band narrower.
    fc.calibration = max(1.0, float(np.sqrt((np.sum(zs**2) + CALIBRATION_PRIOR) / (len(zs) + CALIBRATION_PRIOR))))
    fc.verdict = _verdict(fc, design)
    return fc


def fit_and_forecast(
    compute,
    value,
    *,
    runs=None,
    fit_upto: float | None = None,
    exclude_below: float | None = None,
    a_grid=None,
    target: float | None = None,
    level: float = DEFAULT_LEVEL,
    eval_prompts: int | None = None,
    margin: float = DEFAULT_MARGIN,
    n_resamples: int = 1000,
    model: str | CurveModel = "sigmoid",
) -> tuple[CurveFit, Forecast]:
    """Fit one recipe's curve with ``model`` (a ``fit.model`` name or a ``CurveModel``; several runs
    pooled, each its own correlated series) and forecast it; the fit's warnings stay on the fit
    (``CurveFit.warnings``), not on the console."""
    est = make_model(model, exclude_below=exclude_below, fit_upto=fit_upto, a_grid=a_grid)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = est.fit(compute, value, runs=runs).result_
    fc = forecast(f, level=level, target=target, eval_prompts=eval_prompts, margin=margin, n_resamples=n_resamples)
    return f, fc

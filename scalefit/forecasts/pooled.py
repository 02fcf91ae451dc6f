"""Bands, backtests, verdicts and calls from a campaign's joint fit, seeds the unit of uncertainty.

``forecast_campaign(cfit)`` gives one ``PooledForecast`` per fitted variant (a
``scalefit.forecasts.interface.Forecast``, so comparisons, calls, plots and stop decisions read it as they
read a single fit's); ``forecast_variants(curves, settings)`` fits and forecasts a campaign jointly
or one variant at a time, as its settings say, into one ``CampaignForecast``:

1. **Seed deviations.** Where a variant has several seeds, each seed's departure from the
   variant's mean at each evaluation (scaled by sqrt(k / (k - 1))) is one draw of how a run
   wanders around its recipe's curve: evaluation noise, drift and seed offset together, with
   their correlation over the run kept whole. The campaign's series form one pool (seed noise is
   a property of the setup, the same assumption a t test pooling the seeds' variance makes).
   Without several seeds anywhere, each run's residual series from its fitted curve stands in.
2. **Seed bootstrap of the joint fit.** Each resample gives every run of every variant a
   deviation series drawn from the pool, around the joint fit's curves, and refits the campaign
   the way ``fit_campaign`` did (B's campaign mean re-estimated, its spread kept): the spread of
   the refitted curves is the confidence band; adding the deviation of a new k-seed mean — its
   size from the pool's series over the last third of the fitted range, σ²/k, for one evaluation
   or the mean of the last w — is the prediction band.
3. **Not a sigmoid (or not identified), no band.** B on a bound of its range, A or C_mid on the
   edge of its grid, a curve that rises then falls (its latest evaluations significantly below its
   peak), its latest third off the fitted curve, or a shape the campaign does not share: no band
   and no verdict but the reason, never a band that looks calibrated.
4. **Backtests past the knee.** The campaign is refitted on prefixes of every variant's range
   and asked for later fitted points (at most the question's ratio ahead, at least its square
   root); only variants past their knee at the origin count. Each error is scored against the
   prefix's own prediction sd for the k-seed mean observed there, and the pooled standardised
   errors widen every band of the campaign when they are larger than it claimed (never narrower).
5. **Verdict.** ``predictable`` when a k-seed mean at the target lands within ±margin with
   probability >= the forecast's level (the calibrated band is inside the margin), the knee is
   reached, and nothing is on a grid edge; otherwise each reason in numbers. The expected error is
   the calibrated RMS error of that prediction, noise of the k-seed mean included.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from scipy.interpolate import CubicSpline
from scipy.stats import norm

from scalefit.errors import FitError
from scalefit.forecasts.interface import (
    DEFAULT_RATIO,
    MIN_BACKTESTS,
    STRUCTURE_Z,
    Backtest,
    CampaignForecast,
    Forecast,
    NoiseModel,
    backtest_target,
    calibrate,
    score_backtest,
    spread_out,
)
from scalefit.forecasts.pooled_fit import (
    LOGB_GRID,
    TAU_GRID,
    CampaignFit,
    collapse_reason,
    fine_grid,
    fit_campaign,
    normal_kernel,
    variant_mean,
)
from scalefit.forecasts.seeds import DeviationPool, deviation_pool
from scalefit.forecasts.settings import FitSettings
from scalefit.forecasts.single import eval_sd, fit_and_forecast, forecast, run_series
from scalefit.forecasts.uncertainty import central_percentiles, interval_holding
from scalefit.models.curve import sigmoid_residuals
from scalefit.models.lm import batched_lm
from scalefit.models.sigmoid import B_BOUNDS, KNEE_SHARE, SigmoidFit, chunks
from scalefit.reasons import Reason

TAIL = 1.0 / 3.0  # the structure check looks at the last third of the fitted range
RESAMPLE_GRID = 15
BOOT_FINE = 16  # the resamples' log B grid is interpolated (cubic) onto one this much finer


def _position_key(c: np.ndarray, c_fit: float) -> np.ndarray:
    return np.round(c / c_fit, 6)


def shared_variance(fits: dict[str, SigmoidFit]) -> float:
    """Variance of what every variant's curve shares at one evaluation (the evaluation's prompts
    and seed are the same for all runs at a step): the mean product of two variants' residuals
    (seed means less their fitted curves) at the same position of their ranges, zero compute left out."""
    resid: dict[str, dict[float, float]] = {}
    for v, f in fits.items():
        c_all, v_all = f.inputs
        keep = f.used
        keys = _position_key(c_all[keep], float(f.compute.max()))
        r = v_all[keep] - f.predict(c_all[keep])
        resid[v] = {float(k): float(r[keys == k].mean()) for k in np.unique(keys)}
    names = list(resid)
    products = []
    for i, v in enumerate(names):
        for w in names[i + 1 :]:
            common = set(resid[v]) & set(resid[w])
            products += [resid[v][k] * resid[w][k] for k in common]
    return max(float(np.mean(products)), 0.0) if products else 0.0


def _profile_resamples(
    log_c: np.ndarray, Y: np.ndarray, r0: np.ndarray, logb: np.ndarray, a_range, c_range, start: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``profile_b`` for every resample (rows of Y, R0 per row) at once, from ``start`` (nb, 2)."""
    R, nb = len(Y), len(logb)
    bvals = np.exp(logb)
    lower = np.array([min(a_range), np.log(min(c_range))])
    upper = np.array([max(a_range), np.log(max(c_range))])
    sse, th = np.empty(R * nb), np.tile(start, (R, 1))
    for part in chunks(R * nb, 6 * len(log_c)):
        idx = np.arange(R * nb)[part]

        def residuals(t: np.ndarray, rows: np.ndarray, idx=idx) -> tuple[np.ndarray, np.ndarray]:
            k = idx[rows]
            full = np.column_stack([t[:, 0], bvals[k % nb], t[:, 1]])
            return sigmoid_residuals(full, log_c[None, :], Y[k // nb], r0[k // nb, None], wrt=(0, 2))

        th[part], sse[part] = batched_lm(residuals, th[part], lower, upper, iters=40)
    return sse.reshape(R, nb), th[:, 0].reshape(R, nb), th[:, 1].reshape(R, nb)


def _tau_draws(cfit: CampaignFit, rng: np.random.Generator, n: int) -> np.ndarray:
    """tau for each resample, from its posterior (the campaign's spread of log B is itself uncertain)."""
    w = np.exp(cfit.tau_logpost - cfit.tau_logpost.max())
    return rng.choice(TAU_GRID, size=n, p=w / w.sum())


def _resample_grid(cfit: CampaignFit, tau_hi: float) -> np.ndarray:
    """log B values covering every pooled variant's posterior and the campaign's prior (up to ``tau_hi``)."""
    grid = fine_grid(LOGB_GRID)
    lo, hi = cfit.mu - 5 * tau_hi, cfit.mu + 5 * tau_hi
    for v in cfit.pooled:
        post = cfit.loglik[v] - 0.5 * ((grid - cfit.mu) / tau_hi) ** 2
        inside = grid[post >= post.max() - 12.0]
        lo, hi = min(lo, inside.min()), max(hi, inside.max())
    span = max(hi - lo, 0.2)
    mid = (hi + lo) / 2
    return np.linspace(max(mid - 0.6 * span, LOGB_GRID[0]), min(mid + 0.6 * span, LOGB_GRID[-1]), RESAMPLE_GRID)


def campaign_bootstrap(
    cfit: CampaignFit,
    pool: DeviationPool,
    n_resamples: int,
    seed: int = 0,
    skip: frozenset = frozenset(),
    shared_var: float = 0.0,
) -> dict[str, np.ndarray]:
    """Parameter draws (A, B, C_mid, R0) per variant, resample i of every variant from one
    simulated campaign (so differences between variants are paired): each run a deviation series
    from the pool, each evaluation position a shock shared by every variant (``shared_var``)."""
    names = [v for v in cfit.fits if v not in skip]
    if not names:  # every variant without a band (a backtest's prefix, say): nothing to draw
        return {}
    rng = np.random.default_rng(seed)
    sims, zero_dev = _simulate_campaign(cfit, pool, names, rng, n_resamples, shared_var)
    if cfit.r0_shared:
        shift = np.mean([zero_dev[v] for v in names], axis=0)
        r0s = {v: cfit.r0 + shift for v in names}
    else:
        r0s = {v: cfit.fits[v].R0 + zero_dev[v] for v in names}
    pooled = [v for v in names if v in cfit.pooled]
    out: dict[str, np.ndarray] = _pooled_draws(cfit, pooled, sims, r0s, rng, n_resamples) if pooled else {}
    for v in names:
        if v not in out:
            out[v] = _own_draws(cfit.fits[v], sims[v], r0s[v], n_resamples)
    return out


def _simulate_campaign(
    cfit: CampaignFit,
    pool: DeviationPool,
    names: list[str],
    rng: np.random.Generator,
    n_resamples: int,
    shared_var: float,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Each variant's simulated curves (fit + shared shocks + each run's pooled deviations), and the
    mean deviation at the smallest compute (which moves R0)."""
    keys = {v: _position_key(cfit.fits[v].inputs[0], float(cfit.fits[v].compute.max())) for v in names}
    all_keys = np.unique(np.concatenate([k[k > 0] for k in keys.values()])) if names else np.array([])
    shocks = rng.standard_normal((n_resamples, len(all_keys))) * np.sqrt(shared_var)
    sims, zero_dev = {}, {}
    for v in names:
        f = cfit.fits[v]
        c_all, _ = f.inputs
        c_fit = float(f.compute.max())
        y = np.tile(f.predict(c_all), (n_resamples, 1))
        pos = keys[v] > 0
        y[:, pos] += shocks[:, np.searchsorted(all_keys, keys[v][pos])]
        base = c_all == c_all.min()
        zd = []
        for idx in run_series(f):
            d = pool.draw(rng, c_all[idx] / c_fit, n_resamples)
            y[:, idx] += d
            zd.append(d[:, base[idx]].mean(axis=1) if base[idx].any() else np.zeros(n_resamples))
        sims[v], zero_dev[v] = y, np.mean(zd, axis=0)
    return sims, zero_dev


def _pooled_draws(
    cfit: CampaignFit,
    pooled: list[str],
    sims: dict[str, np.ndarray],
    r0s: dict[str, np.ndarray],
    rng: np.random.Generator,
    n_resamples: int,
) -> dict[str, np.ndarray]:
    """The pooled variants' draws: each resample's joint posterior over log B (its own tau, mu
    re-estimated), every variant's B at its posterior's mode, A and C_mid from its profile there."""
    taus = _tau_draws(cfit, rng, n_resamples)
    grid = _resample_grid(cfit, float(np.quantile(taus, 0.975)))
    fine = fine_grid(grid, BOOT_FINE)
    ll, args = _resample_profiles(cfit, pooled, sims, r0s, grid, fine)
    L = np.stack([ll[v] for v in pooled], axis=1)  # (R, V, nf)
    top = L.max(axis=-1, keepdims=True)
    mu = np.empty(n_resamples)
    for tau in np.unique(taus):  # mu re-estimated in every resample, at that resample's tau
        rows = taus == tau
        marg = np.log(np.maximum(np.exp(L[rows] - top[rows]) @ normal_kernel(fine, fine, tau).T, 1e-300))
        mu[rows] = fine[np.argmax((marg + top[rows]).sum(axis=1), axis=1)]
    out: dict[str, np.ndarray] = {}
    for j, v in enumerate(pooled):
        post = L[:, j, :] - 0.5 * ((fine[None, :] - mu[:, None]) / taus[:, None]) ** 2
        k = np.argmax(post, axis=1)
        a, lcm = args[v]
        f = cfit.fits[v]
        rows = np.arange(n_resamples)
        A = np.clip(a[rows, k], f.a_grid.min(), f.a_grid.max())
        C = np.exp(np.clip(lcm[rows, k], np.log(f.cmid_grid.min()), np.log(f.cmid_grid.max())))
        out[v] = np.column_stack([A, np.exp(fine[k]), C, r0s[v]])
    return out


def _resample_profiles(
    cfit: CampaignFit,
    pooled: list[str],
    sims: dict[str, np.ndarray],
    r0s: dict[str, np.ndarray],
    grid: np.ndarray,
    fine: np.ndarray,
) -> tuple[dict[str, np.ndarray], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Each pooled variant's profile log-likelihood over log B in every resample (on ``fine``), and
    the profile's A and log C_mid there."""
    ll, args = {}, {}
    for v in pooled:
        f = cfit.fits[v]
        sse0, a0, lcm0 = cfit.profiles[v]
        start = np.column_stack([np.interp(grid, LOGB_GRID, a0), np.interp(grid, LOGB_GRID, lcm0)])
        a_range, c_range = (f.a_grid.min(), f.a_grid.max()), (f.cmid_grid.min(), f.cmid_grid.max())
        Y = sims[v][:, f.used]
        sse, a, lcm = _profile_resamples(np.log(f.compute), Y, r0s[v], grid, a_range, c_range, start)
        # smooth in log B: a cubic through the grid's profile, so the posterior's mode can fall between
        # the grid's nodes (a linear interpolation peaks on a node: every draw of B on one of them)
        ll[v] = CubicSpline(grid, -(sse - sse.min(axis=1, keepdims=True)) / (2 * f.prior.temperature), axis=1)(fine)
        args[v] = (CubicSpline(grid, a, axis=1)(fine), CubicSpline(grid, lcm, axis=1)(fine))
    return ll, args


def _own_draws(f: SigmoidFit, sim: np.ndarray, r0_draws: np.ndarray, n_resamples: int) -> np.ndarray:
    """An unpooled variant's draws: its own curve refitted (least squares) to every resample."""
    log_x = np.log(f.compute)[None, :]
    Y, r0 = sim[:, f.used], r0_draws[:, None]

    def residuals(theta: np.ndarray, rows: np.ndarray, Y=Y, r0=r0, log_x=log_x) -> tuple[np.ndarray, np.ndarray]:
        return sigmoid_residuals(theta, log_x, Y[rows], r0[rows])

    lower = np.array([f.a_grid.min(), B_BOUNDS[0], np.log(f.cmid_grid.min())])
    upper = np.array([f.a_grid.max(), B_BOUNDS[1], np.log(f.cmid_grid.max())])
    theta0 = np.tile([f.A, f.B, np.log(f.C_mid)], (n_resamples, 1))
    theta, _ = batched_lm(residuals, theta0, lower, upper, iters=100)
    return np.column_stack([theta[:, 0], theta[:, 1], np.exp(theta[:, 2]), r0_draws])


@dataclass
class PooledForecast(Forecast):
    """A variant's forecast from the joint model (see the module docstring)."""

    noise_var: dict[int, tuple[float, float, float]] = field(default_factory=dict)  # w -> (a, b, floor): _noise_vars
    shared_var: float = 0.0  # one evaluation's shock common to every run of the campaign
    n_seeds: int = 1
    target: float = np.nan
    pool_kind: str = "seeds"
    campaign_backtests: int = 0  # backtests past the knee over the whole campaign (they set ``calibration``)
    alone: Forecast | None = field(default=None, repr=False)  # the variant fitted alone (``own``), once made

    max_backtests: ClassVar[int] = 3  # each origin refits the whole campaign: three, spread over the feasible ones
    backtest_resamples: ClassVar[int] = 120
    paired: ClassVar[bool] = True
    error_name: ClassVar[str] = "expected error"

    def _sd(self, window: int, compute, n_runs: int) -> np.ndarray:
        """sd of the mean of ``n_runs`` runs' means over ``window`` evaluations ending at each compute:
        each run's own deviation (σ²/k) and the shock they all share. Past the data a run's deviation
        grows at least as a random walk's would (its variance above the evaluation's floor in
        proportion to compute), or as fast as the pool's own line says, whichever is faster."""
        if window not in self.noise_var:
            raise ValueError(
                f"no noise estimate for a mean over {window} evaluations (windows {sorted(self.noise_var)})"
            )
        a, b, floor = self.noise_var[window]
        p = np.atleast_1d(np.asarray(compute, float)) / float(self.fit.compute.max())
        var = a + b * p
        walk = floor + max(a + b - floor, 0.0) * p  # a random walk from the base model, through the end of the data
        var = np.where(p > 1.0, np.maximum(var, walk), var)
        return np.sqrt(np.maximum(var, 0.0) / max(n_runs, 1) + self.shared_var / window)

    def noise_sd(self, compute: float, n_runs: int = 1, window: int = 1) -> float:
        """The seeds' own noise: sd of the mean of ``n_runs`` runs' means over ``window`` evaluations
        ending at ``compute``, around the mean curve (no parameter uncertainty, no calibration)."""
        return float(self._sd(window, [compute], n_runs)[0])

    def interval(self, param: str) -> tuple[float, float]:
        """The resamples' central interval of ``param``, reaching the fit shown (``interval_holding``)."""
        if self.no_band:
            return np.nan, np.nan
        draws = self.samples[:, self.fit.sample_names.index(param)]
        if param == "A":  # inside the grid the fit searched: an interval that reaches its edge says so
            draws = np.clip(draws, self.fit.a_grid.min(), self.fit.a_grid.max())
        return interval_holding(draws, float(self.fit.parameters[param].value), self.level)

    def target_draws(self, computes, n_runs: int = 1, window: int | None = None) -> np.ndarray:
        """Draws of the mean of ``n_runs`` runs' evaluations averaged over ``computes`` (one compute: a
        single evaluation; the last k evaluations: their mean): the fit's spread, the seeds' noise at
        the last of them and the backtests' shape error (``calibration``). ``window``: the number of
        evaluations averaged, when ``computes`` stands for them (default ``len(computes)``)."""
        c, curves = self._curves(computes)
        point = float(self.point(c).mean())
        fit_dev = curves.mean(axis=1, keepdims=True) - point
        scale = self.sigma_draws / self.noise.sigma if self.noise.sigma > 0 else np.ones(len(curves))
        rng = np.random.default_rng(self.seed + 1)
        noise = (rng.standard_normal(len(curves)) * scale * self._sd(window or len(c), c.max(), n_runs)[0])[:, None]
        c_fit = float(self.fit.compute.max())
        return self.calibration.widen(np.array([[point]]), fit_dev, noise, [c.max()], c_fit, self.seed)[:, 0]

    def prediction_draws(self, compute, n_runs: int = 1) -> np.ndarray:
        c, curves = self._curves(compute)
        scale = self.sigma_draws / self.noise.sigma if self.noise.sigma > 0 else np.ones(len(curves))
        rng = np.random.default_rng(self.seed + 1)
        noise = rng.standard_normal(curves.shape) * scale[:, None] * self._sd(1, c, n_runs)[None, :]
        point = self.point(c)[None, :]
        return self.calibration.widen(point, curves - point, noise, c, float(self.fit.compute.max()), self.seed)

    def expected_error_at(self, computes, n_runs: int | None = None, window: int | None = None) -> float:
        """Expected error of the point prediction against what ``n_runs`` seeds (default: this
        variant's) will show averaged over ``computes``: the calibrated draws' spread, their noise
        σ²/k included, as a standard deviation (half their central 68.27% interval: the RMS for
        normal draws, and finite where few seeds give the noise level a heavy tail, as one
        variant's two seeds do: one degree of freedom, a draw's RMS then has no finite value).
        NaN for a curve with no band."""
        if self.no_band:
            return float("nan")
        d = self.target_draws(computes, n_runs or self.n_seeds, window)
        lo, hi = np.percentile(d - float(self.point(computes).mean()), [15.865, 84.135])
        return float((hi - lo) / 2)

    @property
    def mean_windows(self) -> tuple[int, ...]:
        """The windows the seed pool has a noise line for (``noise_var``)."""
        return tuple(self.noise_var)

    @property
    def window(self) -> int:
        """The target the verdict and the expected error are about: the mean of this many evaluations."""
        return max(self.noise_var) if self.noise_var else 1

    @property
    def expected_error(self) -> float | None:
        """RMS error against the mean of this variant's seeds' last ``window`` evaluations at the target."""
        if self.no_band or not np.isfinite(self.target):
            return None
        return self.expected_error_at([self.target], window=self.window)

    def doubts(self) -> list[Reason]:
        """The knee and the grid edges (B on its bound is a shape reason: no band), then a campaign
        whose extrapolation too few backtests past the knee checked."""
        out = [r for r in self.fit.identified() if not (r.kind == "bound" and r.words["param"] == "B")]
        if self.campaign_backtests < MIN_BACKTESTS:
            n = {"n": self.campaign_backtests, "need": MIN_BACKTESTS}
            out.append(Reason("backtests", n, {"form": "campaign"}))
        return out

    def _misses(self) -> np.ndarray | None:
        """How far each draw of the mean of this variant's seeds' last ``window`` evaluations at the
        target lands from the prediction (None: no band)."""
        if self.no_band or not np.isfinite(self.target):
            return None
        d = self.target_draws([self.target], self.n_seeds, self.window)
        return np.abs(d - float(self.point([self.target])[0]))

    @property
    def p_within(self) -> float | None:
        """The probability that a mean of this variant's seeds' last ``window`` evaluations at the
        target lands within ±margin of the prediction (None: no band)."""
        misses = self._misses()
        return None if misses is None else float(np.mean(misses <= self.margin))

    def error_doubt(self) -> tuple[Reason | None, float | None]:
        """A k-seed mean at the target that lands within ±margin with probability below the level."""
        w = self.window
        misses = self._misses()
        p_within = None if misses is None else float(np.mean(misses <= self.margin))
        if p_within is None or p_within >= self.level:
            return None, None
        half = float(np.percentile(misses, 100 * self.level))
        z = float(norm.ppf(0.5 + self.level / 2))
        seeds_alone = z * float(self._sd(w, [self.target], self.n_seeds)[0])
        numbers = {"seeds": self.n_seeds, "window": w, "ratio": self.ratio, "margin": self.margin, "p": p_within}
        numbers.update(level=self.level, half=half, seeds_alone=seeds_alone)
        return Reason("p_within", numbers), None

    def unchecked_extrapolation(self, name: str) -> list[Reason]:
        """Fewer than ``MIN_BACKTESTS`` backtests past the knee in the campaign."""
        if self.campaign_backtests >= MIN_BACKTESTS:
            return []
        return [Reason("unchecked", {"n": self.campaign_backtests, "need": MIN_BACKTESTS}, {"arm": name})]

    def own_fit(self) -> SigmoidFit:
        """The variant's ``unpooled`` fit (no campaign prior on B); its fit where nothing was pooled."""
        fit = self.fit
        return fit if fit.prior is None or fit.unpooled is None else fit.unpooled

    def own(self) -> Forecast:
        """The variant's forecast from its own data alone (its ``unpooled`` fit: no campaign prior on
        B, so B's uncertainty is as wide as its seeds leave it); itself where nothing was pooled.
        Resampled once (``OWN_RESAMPLES``; no backtests of its own: the campaign's calibration widens it)."""
        fit = self.fit
        if fit.prior is None or fit.unpooled is None:
            return self
        if self.alone is None:
            n = min(len(self.samples), OWN_RESAMPLES)
            alone = forecast(
                fit.unpooled, level=self.level, margin=self.margin, n_resamples=n, seed=self.seed, backtest=False
            )
            alone.calibration = self.calibration  # the campaign's backtests' shape error is its too
            self.alone = alone
        return self.alone

    def b_tie(self, candidate: Forecast, b_candidate: float) -> str | None:
        """ΔB's interval from the paired resamples (one simulated campaign each) when it holds 0."""
        if candidate.no_band:
            return None
        d = candidate.samples[:, 1] - self.samples[:, 1]
        d_lo, d_hi = np.percentile(d[np.isfinite(d)], central_percentiles(self.level))
        if d_lo <= 0.0 <= d_hi:
            return f"; ΔB's {self.level:.0%} interval [{d_lo:+.3f}, {d_hi:+.3f}] holds 0"
        return None

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict() if not self.no_band else {"level": self.level, "no_band": list(self.no_band)}
        out.update(
            noise_var={str(k): list(v) for k, v in self.noise_var.items()},
            n_seeds=self.n_seeds,
            target=self.target,
            noise_from=self.pool_kind,
            verdict=self.verdict.to_dict() if self.verdict else None,
        )
        return out


OWN_RESAMPLES = 200  # the variant's own fit, resampled only to back a call past its data


def shape_reasons(fit: SigmoidFit, pool: DeviationPool, n_seeds: int) -> list[Reason]:
    """Why this curve is not a sigmoid its band could be trusted on (empty when it is one)."""
    out = []
    if fit.outlier:  # a shape no other variant shares: the sigmoid may not be its curve
        out.append(fit.pool_note)
    if fit.a_at_edge:
        out.append(Reason("grid_edge", {"value": fit.A}, {"param": "A"}))
    if fit.cmid_at_edge:
        out.append(Reason("grid_edge", {"value": fit.C_mid}, {"param": "C_mid"}))
    if fit.b_at_bound:
        shape = {"param": "B", "form": "shape", "shape": "step" if fit.B > 1 else "flat line"}
        out.append(Reason("bound", {"value": fit.B}, shape))
    collapse = collapse_reason(fit, pool, n_seeds)
    if collapse and getattr(fit.pool_note, "kind", "") != "collapse":  # said once
        out.append(collapse)
    cs, m = variant_mean(fit)
    k = max(n_seeds, 1)
    used = cs > 0
    c_fit = cs[used]
    third = c_fit[c_fit >= c_fit.max() * (1.0 - TAIL) - 1e-12] if len(c_fit) else c_fit
    n_tail = len(third)
    if n_tail >= 2:
        resid = m[np.isin(cs, third)] - fit.predict(third)
        se = pool.sd(n_tail) / np.sqrt(k)
        z = float(resid.mean() / se) if se > 0 else 0.0
        if abs(z) > STRUCTURE_Z:
            out.append(Reason("structure", {"z": z}, {"model": "sigmoid"}))
    return out


def _noise_vars(
    pool: DeviationPool, windows: tuple[int, ...], eval_prompts: int | None, level: float, shared_var: float
) -> dict[int, tuple[float, float, float]]:
    """The pool's variance line for each window, and the part of it that does not grow with compute
    (the evaluation's own: mean@16's binomial variance when the evaluation's size is known, a floor
    under the line's intercept; else none)."""
    out = {}
    sd = eval_sd(level, eval_prompts)
    for w in windows:
        a, b = pool.variance(w)
        floor = 0.0 if sd is None else max(float(sd) ** 2 - shared_var, 0.0) / w
        out[w] = (max(a, floor), b, floor)
    return out


def windows(settings: FitSettings) -> tuple[int, ...]:
    """The numbers of successive evaluations whose mean is predicted: one, and the last ``last_k``."""
    return tuple(sorted({1, settings.last_k}))


def _build_forecasts(
    cfit: CampaignFit, settings: FitSettings, ratio: float | dict[str, float] | None, n_resamples: int, seed: int
) -> dict[str, PooledForecast]:
    """Every variant's forecast from one campaign bootstrap, before backtests (``settings``: level,
    margin, evaluation size and ``windows``)."""
    seeds = {v: len(np.unique(f.run_inputs)) for v, f in cfit.fits.items()}
    pool = deviation_pool(cfit.fits)
    no_band = {v: shape_reasons(f, pool, seeds[v]) for v, f in cfit.fits.items()}
    clean = {v: f for v, f in cfit.fits.items() if not no_band[v]}
    if clean and len(clean) < len(cfit.fits):
        with contextlib.suppress(FitError):  # a collapsing variant's seeds do not set everyone's noise
            pool = deviation_pool(clean)
    level_now = float(np.mean([f.predict(f.compute.max()) for f in cfit.fits.values()]))
    skip = frozenset(v for v in no_band if no_band[v])
    shared = shared_variance({v: f for v, f in cfit.fits.items() if v not in skip})
    nv = _noise_vars(pool, windows(settings), settings.eval_prompts, level_now, shared)
    sd1 = float(np.sqrt(sum(nv[1][:2])))  # one evaluation at the end of the fitted range
    draws = campaign_bootstrap(cfit, pool, n_resamples, seed, skip, shared)
    rng = np.random.default_rng(seed + 3)
    dof = max(pool.dof, 1)
    sigma_draws = sd1 * np.sqrt(dof / rng.chisquare(dof, size=n_resamples))
    out = {}
    for v, f in cfit.fits.items():
        r = ratio.get(v, DEFAULT_RATIO) if isinstance(ratio, dict) else (ratio or DEFAULT_RATIO)
        out[v] = PooledForecast(
            f,
            settings.level,
            NoiseModel(sd1, pool.phi(), dof, None, seeds[v]),
            draws.get(v, np.full((n_resamples, 4), np.nan)),
            sigma_draws,
            r,
            settings.margin,
            seed=seed,
            no_band=no_band[v],
            noise_var=nv,
            shared_var=shared,
            n_seeds=seeds[v],
            target=float(f.compute.max()) * r,
            pool_kind=pool.kind,
        )
    return out


def _backtests(
    cfit: CampaignFit, full: dict[str, PooledForecast], ratio: float, settings: FitSettings, seed: int
) -> dict[str, list[Backtest]]:
    """Refit the campaign on prefixes (the same fraction of every variant's fitted range) and score
    each variant past its knee at the origin on its farthest fitted point within ``ratio``
    (``score_backtest``); the latest feasible origins, at most ``PooledForecast.max_backtests``."""
    ref = max(cfit.fits.values(), key=lambda f: len(np.unique(f.compute)))
    pos = np.unique(ref.compute) / ref.compute.max()
    feasible = [float(q) for q in pos[3:] if backtest_target(pos, q, ratio) is not None]
    out: dict[str, list[Backtest]] = {v: [] for v in cfit.fits}
    for q in spread_out(feasible, PooledForecast.max_backtests):
        upto = {v: q * float(f.compute.max()) for v, f in cfit.fits.items()}
        try:
            prefix = cfit.refit(fit_upto=upto)
            fcs = _build_forecasts(prefix, settings, None, PooledForecast.backtest_resamples, seed)
        except FitError:
            continue
        for v, fc in fcs.items():
            if v not in full or fc.no_band or full[v].no_band or cfit.fits[v].knee_share(upto[v]) < KNEE_SHARE:
                continue
            f = cfit.fits[v]
            if backtest_target(f.compute, upto[v], ratio) is not None:
                out[v].append(score_backtest(fc, upto[v], f.compute, f.value, ratio, settings.last_k))
    return out


def forecast_campaign(
    cfit: CampaignFit,
    settings: FitSettings | None = None,
    *,
    target: float | dict[str, float] | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    backtest: bool = True,
) -> dict[str, PooledForecast]:
    """Forecast every fitted variant of a joint fit (see the module docstring) at ``settings``' level
    and margin, with its evaluation size and ``last_k`` (default ``FitSettings()``).

    target: the compute the predictions are for, one or one per variant (default: the variant's
      last held-out point, else 2x its fitted compute).
    """
    settings = settings or FitSettings()
    if n_resamples < 20:
        raise FitError(f"n_resamples must be at least 20, got {n_resamples}")
    if not cfit.fits:
        return {}
    ratio: dict[str, float] = {}
    for v, f in cfit.fits.items():
        c_fit = float(f.compute.max())
        t = target.get(v) if isinstance(target, dict) else target
        if t is None and len(f.heldout_compute):
            t = float(f.heldout_compute.max())
        ratio[v] = max(float(t) / c_fit, 1.0) if t is not None else DEFAULT_RATIO
    fcs = _build_forecasts(cfit, settings, ratio, n_resamples, seed)
    if backtest:
        question = float(np.median(list(ratio.values())))
        bts = _backtests(cfit, fcs, question, settings, seed)
        cal = calibrate(b for bt in bts.values() for b in bt)
        n_bt = sum(len(b) for b in bts.values())
        for v, fc in fcs.items():
            fc.backtests, fc.calibration, fc.campaign_backtests = bts.get(v, []), cal, n_bt
    for fc in fcs.values():
        fc.verdict = fc.judge()
    return fcs


def fit_and_forecast_campaign(
    curves,
    settings: FitSettings | None = None,
    *,
    fit_upto=None,
    target=None,
    n_resamples: int = 1000,
    backtest: bool = True,
) -> tuple[CampaignFit, dict[str, PooledForecast]]:
    """``fit_campaign`` then ``forecast_campaign``: the joint model of a campaign in one call, with
    ``settings``' pooling, ``exclude_below`` and A grid (None: ``FitSettings()`` and the model's own grid)."""
    s = settings or FitSettings()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfit = fit_campaign(
            curves,
            pooling=s.pooling,
            fit_upto=fit_upto,
            exclude_below=s.exclude_below,
            a_grid=s.a_values if settings is not None else None,
        )
    return cfit, forecast_campaign(cfit, s, target=target, n_resamples=n_resamples, backtest=backtest)


def forecast_variants(
    curves, settings: FitSettings, *, fit_upto=None, target=None, n_resamples: int = 1000
) -> CampaignForecast:
    """Every variant of a campaign fitted and forecast as ``settings.pooling`` says: jointly
    (``partial``: ``fit_and_forecast_campaign``) or each on its own (``none``: ``fit_and_forecast``,
    with ``settings.model``). ``curves``: variant -> (compute, value, runs); ``fit_upto`` and
    ``target``: one per variant (missing: all of its points; 2x its fitted compute)."""
    upto, goal = fit_upto or {}, target or {}
    if settings.pooling == "partial":
        cfit, fcs = fit_and_forecast_campaign(
            curves, settings, fit_upto=fit_upto, target=target, n_resamples=n_resamples
        )
        return CampaignForecast(dict(cfit.fits), dict(fcs), dict(cfit.failed), cfit.describe())
    fits, fcs, failed = {}, {}, {}
    for v, (c, y, runs) in curves.items():
        try:
            fits[v], fcs[v] = fit_and_forecast(
                c, y, settings, runs=runs, fit_upto=upto.get(v), target=goal.get(v), n_resamples=n_resamples
            )
        except FitError as e:
            failed[v] = e.why
    how = "pooling none: each variant fitted on its own"
    if settings.model != "sigmoid":
        how += f"; fit model {settings.model.replace('_', ' ')}"
    return CampaignForecast(fits, fcs, failed, how)

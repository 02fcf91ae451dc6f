"""Campaign-level pooling: every variant of a campaign fitted, and forecast, together.

``fit_campaign(curves)`` is the one entry point (a fit-model interface can wrap it): a mapping
variant → (compute, value, runs) in, a ``CampaignFit`` out, whose ``fits`` are ordinary
``SigmoidFit`` objects (``PooledFit``) that the comparisons, plots and tables already read.

- **R0 shared** when the variants start from one base model: their zero-compute evaluations
  agree within ``R0_TOLERANCE``; then every variant uses the campaign's mean of them.
- **A and C_mid per variant.**
- **log B partially pooled** (empirical Bayes): log B_v ~ N(mu, tau^2). Each variant's profile
  likelihood of log B (A and C_mid profiled out on a grid of B, then polished) is tempered by its
  residual variance and the AR(1) correlation of its residuals (successive evaluations of a run
  carry less than independent points); mu and tau maximise the product of the variants'
  likelihoods integrated against the normal (tau's mode under the boundary-avoiding prior
  p(tau) ∝ tau of Chung et al. 2013, so two variants alike by chance are not forced equal).
  Each variant's B is then its posterior mode: points that pin B keep it, points that cannot (a
  curve stopped near its knee) borrow the campaign's. A variant whose own B is incompatible
  with the campaign's (|z| > ``OUTLIER_Z``) leaves the pool and is fitted alone, and says so.
- ``pooling="none"`` is the per-variant fit of ``fit_sigmoid``, unchanged.

``forecast_campaign`` (``scalefit.forecasts.pooled``) turns the joint fit into bands, backtests and
verdicts with seeds as the unit of uncertainty.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import expit

from scalefit.errors import FitError
from scalefit.forecasts.seeds import DeviationPool, deviation_pool
from scalefit.forecasts.settings import POOLING
from scalefit.forecasts.single import noise_model, run_series
from scalefit.models.curve import sigmoid_residuals
from scalefit.models.lm import batched_lm
from scalefit.models.sigmoid import B_BOUNDS, SigmoidFit, b_on_bound, chunks, edge_warnings, fit_sigmoid
from scalefit.reasons import Reason

R0_TOLERANCE = 0.01  # zero-compute evaluations this close: one base model, one R0
LOGB_GRID = np.linspace(np.log(0.05), np.log(B_BOUNDS[1]), 121)  # neighbours 5.9% apart; up to B's bound
FINE = 4  # the likelihoods are interpolated onto a grid this much finer for the integrals
TAU_GRID = np.geomspace(0.003, 3.0, 61)
PHI_CAP = 0.8  # caps the AR(1) information loss at (1 + 0.8) / (1 - 0.8) = 9x
OUTLIER_Z = 3.5
COLLAPSE_Z = 4.0
CALIBRATION_RESAMPLES = 100
TEMPERATURE_RANGE = 30.0  # the seed bootstrap moves a variant's likelihood temperature at most this much
N_CMID_START = 100


def fine_grid(grid: np.ndarray, factor: int = FINE) -> np.ndarray:
    """``grid`` with ``factor - 1`` points inserted linearly between neighbours."""
    n = (len(grid) - 1) * factor + 1
    return np.interp(np.linspace(0, len(grid) - 1, n), np.arange(len(grid)), grid)


def profile_b(
    log_c: np.ndarray, y: np.ndarray, r0: float, logb: np.ndarray, a_range, cmid_range
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least-squares SSE at each fixed B = exp(logb), A and C_mid free inside their ranges.

    Start: for each B, every C_mid of ``N_CMID_START`` linear values with A in closed form (the
    curve is linear in A); then each B's best cell is polished by Levenberg–Marquardt in
    (A, log C_mid). Sums over points are accumulated in chunks (bounded memory for any n).
    Returns SSE, A and log C_mid, one per B.
    """
    a_lo, a_hi = float(np.min(a_range)), float(np.max(a_range))
    cm = np.linspace(float(np.min(cmid_range)), float(np.max(cmid_range)), N_CMID_START)
    lcm = np.log(cm)
    bvals = np.exp(logb)
    e = r0 - y
    s2 = np.zeros((len(cm), len(bvals)))
    s1 = np.zeros((len(cm), len(bvals)))
    for part in chunks(len(y), len(cm) * len(bvals)):
        s = expit(-bvals[None, :, None] * (lcm[:, None, None] - log_c[None, None, part]))
        s2 += np.einsum("cbn,cbn->cb", s, s)
        s1 += np.einsum("cbn,n->cb", s, e[part])
    d = np.clip(-s1 / np.maximum(s2, 1e-300), a_lo - r0, a_hi - r0)
    sse = d**2 * s2 + 2.0 * d * s1 + e @ e
    ic = np.argmin(sse, axis=0)
    theta0 = np.column_stack([r0 + d[ic, np.arange(len(bvals))], lcm[ic]])
    lower, upper = np.array([a_lo, lcm[0]]), np.array([a_hi, lcm[-1]])
    if a_lo == a_hi:  # A fixed (a comparison's shared asymptote): only C_mid moves
        lower[0] = upper[0] = a_lo
    theta = np.empty_like(theta0)
    sse_out = np.empty(len(bvals))
    for part in chunks(len(bvals), 4 * len(y)):
        rows_b = bvals[part]

        def residuals(th: np.ndarray, rows: np.ndarray, rows_b=rows_b) -> tuple[np.ndarray, np.ndarray]:
            full = np.column_stack([th[:, 0], rows_b[rows], th[:, 1]])
            return sigmoid_residuals(full, log_c[None, :], y[None, :], r0, wrt=(0, 2))

        theta[part], sse_out[part] = batched_lm(residuals, theta0[part], lower, upper, iters=100)
    return sse_out, theta[:, 0], theta[:, 1]


def _interp_rows(grid: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Linear interpolation of each row of ``values`` (..., len(grid)) at the points ``at``."""
    idx = np.clip(np.searchsorted(grid, at) - 1, 0, len(grid) - 2)
    w = np.clip((at - grid[idx]) / (grid[idx + 1] - grid[idx]), 0.0, 1.0)
    return values[..., idx] * (1.0 - w) + values[..., idx + 1] * w


def normal_kernel(grid: np.ndarray, mu: np.ndarray, tau: float) -> np.ndarray:
    """Discretised N(mu, tau^2) over ``grid``: one row of weights summing to 1 per mu."""
    k = np.exp(-0.5 * ((grid[None, :] - mu[:, None]) / tau) ** 2)
    return k / np.maximum(k.sum(axis=1, keepdims=True), 1e-300)


def log_marginal(loglik: np.ndarray, grid: np.ndarray, mu: np.ndarray, tau: float) -> np.ndarray:
    """log ∫ L_v(b) N(b; mu, tau^2) db for each variant (rows of ``loglik``, ..., len(grid)) and each mu."""
    top = loglik.max(axis=-1, keepdims=True)
    m = np.exp(loglik - top) @ normal_kernel(grid, mu, tau).T
    return np.log(np.maximum(m, 1e-300)) + top


def estimate_hyper(loglik: np.ndarray, grid: np.ndarray) -> tuple[float, float, np.ndarray]:
    """mu and tau of log B ~ N(mu, tau^2) from the variants' log-likelihoods on ``grid``: the mode
    of the integrated likelihood times p(tau) ∝ tau (flat in mu). Also the log posterior of tau over
    ``TAU_GRID`` (mu profiled out), from which the bootstrap draws tau."""
    support = (loglik - loglik.max(axis=1, keepdims=True)).max(axis=0) >= -25.0  # where any variant has mass
    lo, hi = np.flatnonzero(support)[[0, -1]]
    mus = grid[lo : hi + 1 : 2]
    logpost = np.empty(len(TAU_GRID))
    for j, tau in enumerate(TAU_GRID):
        logpost[j] = (log_marginal(loglik, grid, mus, tau).sum(axis=0) + np.log(tau)).max()
    tau = float(TAU_GRID[int(np.argmax(logpost))])
    mus = grid[lo : hi + 1]
    total = log_marginal(loglik, grid, mus, tau).sum(axis=0)  # mu on the full grid at that tau
    return float(mus[int(np.argmax(total))]), tau, logpost


def _likelihood_sd(loglik: np.ndarray, grid: np.ndarray) -> float:
    """Half-width of {b: loglik(b) >= max - 1/2} (one sd for a normal likelihood; wide when flat)."""
    inside = grid[loglik >= loglik.max() - 0.5]
    return float(max((inside.max() - inside.min()) / 2.0, (grid[1] - grid[0]) / 2.0))


@dataclass
class Prior:
    """The campaign's prior on a variant's log B, and the variant's likelihood temperature."""

    mu: float
    tau: float
    temperature: float  # 2 x temperature x (log-likelihood) = -SSE: residual variance x AR(1) inflation

    @property
    def B(self) -> float:
        return float(np.exp(self.mu))


@dataclass
class PooledFit(SigmoidFit):
    """One variant of a joint fit: B is its posterior mode under the campaign's prior on log B.

    ``refit`` keeps the prior (a comparison's refit at a shared A, a backtest's prefix), so every
    number derived from this fit stays a pooled one. ``prior`` is None for a variant fitted alone.
    """

    prior: Prior | None = None
    unpooled: SigmoidFit | None = field(default=None, repr=False)
    pool_note: str = ""  # why it was fitted alone (its shape is unlike the campaign's)

    @property
    def outlier(self) -> bool:
        return bool(self.pool_note)

    def pooling(self) -> tuple[Prior | None, str]:
        return self.prior, self.pool_note

    def refit(self, **overrides: Any) -> SigmoidFit:
        base = self.unpooled.refit(**overrides)
        if self.prior is None:
            return PooledFit(**{**vars(base), "unpooled": base, "pool_note": self.pool_note})
        return penalized_fit(base, self.prior)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["pooled"] = self.prior is not None
        if self.prior is not None:
            out["prior_B"] = self.prior.B
            out["prior_tau"] = self.prior.tau
        if self.pool_note:
            out["pool_note"] = self.pool_note
        return out


def _fit_points(fit: SigmoidFit) -> tuple[np.ndarray, np.ndarray]:
    return np.log(fit.compute), fit.value


def _ranges(fit: SigmoidFit) -> tuple[tuple[float, float], tuple[float, float]]:
    return (float(fit.a_grid.min()), float(fit.a_grid.max())), (float(fit.cmid_grid.min()), float(fit.cmid_grid.max()))


def temperature(fit: SigmoidFit) -> float:
    """Variance per point that turns a variant's SSE into its log-likelihood, first guess: the
    residual variance times (1 + phi) / (1 - phi), phi the residuals' lag-1 correlation within runs
    (capped); ``fit_campaign`` then matches the likelihood's width to the seed bootstrap's."""

    noise = noise_model(fit)
    phi = min(noise.phi, PHI_CAP)
    return max(noise.sigma**2, 1e-10) * (1.0 + phi) / (1.0 - phi)


def _bootstrap_logb_sd(fit: SigmoidFit, pool: DeviationPool, rng: np.random.Generator, n: int) -> float:
    """Robust sd (IQR / 1.349) of log B over refits of this variant alone to ``n`` seed-bootstrap
    resamples around its fitted curve: how much its own points say about B."""
    c_all, _ = fit.inputs
    c_fit = float(fit.compute.max())
    y = np.tile(fit.predict(c_all), (n, 1))
    for idx in run_series(fit):
        y[:, idx] += pool.draw(rng, c_all[idx] / c_fit, n)
    Y, log_x = y[:, fit.used], np.log(fit.compute)[None, :]

    def residuals(theta: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return sigmoid_residuals(theta, log_x, Y[rows], fit.R0)

    (a_lo, a_hi), (c_lo, c_hi) = _ranges(fit)
    lower, upper = np.array([a_lo, B_BOUNDS[0], np.log(c_lo)]), np.array([a_hi, B_BOUNDS[1], np.log(c_hi)])
    theta, _ = batched_lm(residuals, np.tile([fit.A, fit.B, np.log(fit.C_mid)], (n, 1)), lower, upper, iters=100)
    q75, q25 = np.percentile(np.log(theta[:, 1]), [75, 25])
    return float((q75 - q25) / 1.349)


def variant_mean(fit: SigmoidFit) -> tuple[np.ndarray, np.ndarray]:
    """The mean over runs at each fitted compute (computes in order), zero compute included."""
    c_all, v_all = fit.inputs
    keep = fit.used | (c_all == c_all.min())
    cs = np.unique(c_all[keep])
    return cs, np.array([v_all[keep & (c_all == x)].mean() for x in cs])


def collapse_reason(fit: SigmoidFit, pool: DeviationPool, n_seeds: int) -> Reason | None:
    """ "rises then falls: ..." when the variant's mean over a few evaluations ends more than
    ``COLLAPSE_Z`` standard errors (from the campaign's seed deviations) below its peak, else None."""
    cs, m = variant_mean(fit)
    w = min(3, max(len(m) // 4, 1))
    if len(m) < 2 * w + 2:
        return None
    smooth = np.convolve(m, np.ones(w) / w, mode="valid")
    peak = int(np.argmax(smooth[:-1]))
    drop = float(smooth[peak] - smooth[-1])
    se = pool.sd(w) * np.sqrt(2.0 / max(n_seeds, 1))
    if se > 0 and drop / se > COLLAPSE_Z and peak < len(smooth) - 2:
        numbers = {"window": w, "peak": smooth[peak], "peak_compute": cs[peak + w - 1], "end": smooth[-1]}
        return Reason("collapse", {**numbers, "z": drop / se})
    return None


def _nearest(grid: np.ndarray, x: float) -> float:
    return float(grid[int(np.argmin(np.abs(grid - x)))])


def _with_params(fit: SigmoidFit, A: float, B: float, C_mid: float, prior: Prior | None, note: str = "") -> PooledFit:
    """The variant's fit object carrying the pooled parameters (SSE and edge notes recomputed)."""
    log_c, y = _fit_points(fit)
    r, _ = sigmoid_residuals(np.array([[A, B, np.log(C_mid)]]), log_c[None, :], y[None, :], fit.R0)
    grid_A, grid_C = _nearest(fit.a_grid, A), _nearest(fit.cmid_grid, C_mid)
    ia, ic = int(np.argmin(np.abs(fit.a_grid - A))), int(np.argmin(np.abs(fit.cmid_grid - C_mid)))
    notes = edge_warnings(fit.a_grid, fit.cmid_grid, ia, ic) if (len(fit.a_grid) > 1 or len(fit.cmid_grid) > 1) else []
    if b_on_bound(B):
        notes.append(f"B = {B:.3g} is at a bound of its range {B_BOUNDS}: not a sigmoid")
    base = {k: v for k, v in vars(fit).items() if k not in ("prior", "unpooled", "pool_note")}
    base.update(A=float(A), B=float(B), C_mid=float(C_mid), sse=float(np.sum(r**2)), grid_A=grid_A, grid_C_mid=grid_C)
    base["warnings"] = notes
    unpooled = fit.unpooled if isinstance(fit, PooledFit) and fit.unpooled is not None else fit
    return PooledFit(**base, prior=prior, unpooled=unpooled, pool_note=note)


def penalized_fit(fit: SigmoidFit, prior: Prior) -> PooledFit:
    """The posterior mode of one variant under ``prior``: SSE + temperature x ((log B - mu) / tau)^2
    minimised in (A, log B, log C_mid) inside the fit's ranges, from the best profile point."""
    log_c, y = _fit_points(fit)
    a_range, c_range = _ranges(fit)
    sse, a, lcm = profile_b(log_c, y, fit.R0, LOGB_GRID, a_range, c_range)
    post = -sse / (2 * prior.temperature) - 0.5 * ((LOGB_GRID - prior.mu) / prior.tau) ** 2
    i = int(np.argmax(post))
    return _polish_penalized(fit, prior, a[i], LOGB_GRID[i], lcm[i])


def _polish_penalized(fit: SigmoidFit, prior: Prior, a0: float, logb0: float, lcm0: float) -> PooledFit:
    log_c, y = _fit_points(fit)
    (a_lo, a_hi), (c_lo, c_hi) = _ranges(fit)
    weight = np.sqrt(prior.temperature) / prior.tau

    def residuals(th: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        full = np.column_stack([th[:, 0], np.exp(th[:, 1]), th[:, 2]])
        r, jac = sigmoid_residuals(full, log_c[None, :], y[None, :], fit.R0)  # a fresh array
        jac[..., 1] *= full[:, 1:2]  # d/d log B
        pen = weight * (th[:, 1:2] - prior.mu)
        jpen = np.zeros((len(th), 1, 3))
        jpen[:, 0, 1] = weight
        return np.concatenate([r, pen], axis=1), np.concatenate([jac, jpen], axis=1)

    lower = np.array([a_lo, np.log(B_BOUNDS[0]), np.log(c_lo)])
    upper = np.array([a_hi, np.log(B_BOUNDS[1]), np.log(c_hi)])
    theta, _ = batched_lm(residuals, np.array([[a0, logb0, lcm0]]), lower, upper, iters=200)
    A, logb, lcm = theta[0]
    return _with_params(fit, A, float(np.exp(logb)), float(np.exp(lcm)), prior)


@dataclass
class CampaignFit:
    """A campaign's variants fitted together; ``fits`` holds one ``PooledFit`` per fitted variant."""

    fits: dict[str, PooledFit]
    failed: dict[str, str]  # variant -> why it has no fit (FitError's message)
    pooling: str
    mu: float | None = None  # log B's campaign mean and spread (None: not pooled)
    tau: float | None = None
    tau_logpost: np.ndarray | None = field(default=None, repr=False)  # over TAU_GRID: the bootstrap draws tau
    r0_shared: bool = False
    r0: float | None = None
    loglik: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # pooled variants, on fine_grid(LOGB_GRID)
    profiles: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    inputs: Mapping[str, tuple[Any, Any, Any]] = field(default_factory=dict, repr=False)
    settings: dict[str, Any] = field(default_factory=dict, repr=False)

    def refit(self, **overrides: Any) -> CampaignFit:
        """The same campaign fitted again with some settings changed (e.g. a prefix: ``fit_upto``)."""
        return fit_campaign(self.inputs, **{**self.settings, **overrides})

    @property
    def pooled(self) -> list[str]:
        return [v for v, f in self.fits.items() if f.prior is not None]

    def describe(self) -> str:
        """One line: how the campaign was fitted (the LOO table states it)."""
        if self.pooling == "none":
            return "pooling none: each variant fitted on its own"
        r0 = f"R0 {self.r0:.3f} shared" if self.r0_shared else "R0 per variant (their zero-compute evaluations differ)"
        if self.mu is None:
            return f"pooling partial: fewer than two variants to pool B over; {r0}"
        alone = [v for v, f in self.fits.items() if f.prior is None]
        text = (
            f"pooling partial: B pooled over {len(self.pooled)} variants (campaign B {np.exp(self.mu):.2f}, "
            f"spread of log B tau = {self.tau:.2f}); A and C_mid per variant; {r0}"
        )
        if alone:
            text += f"; fitted alone: {', '.join(alone)}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "pooling": self.pooling,
            "description": self.describe(),
            "campaign_B": None if self.mu is None else float(np.exp(self.mu)),
            "tau": self.tau,
            "r0_shared": self.r0_shared,
            "r0": self.r0,
            "fits": {v: f.to_dict() for v, f in self.fits.items()},
            "failed": dict(self.failed),
        }


def _zero_compute_means(curves: Mapping[str, tuple]) -> dict[str, float]:
    out = {}
    for v, (c, y, _) in curves.items():
        c, y = np.asarray(c, float), np.asarray(y, float)
        if len(c) and np.isfinite(c).all() and (c == 0).any():
            out[v] = float(np.mean(y[c == 0]))
    return out


def fit_campaign(
    curves: Mapping[str, tuple[Any, Any, Any]],
    *,
    pooling: str = "partial",
    share_r0: bool | None = None,
    exclude_below: float | None = None,
    fit_upto: float | Mapping[str, float] | None = None,
    a_grid=None,
    cmid_grid=None,
) -> CampaignFit:
    """Fit a campaign's variants jointly (see the module docstring).

    curves: variant -> (compute, value, runs), runs one label per point (seeds; None: one run).
    share_r0: None decides from the data (zero-compute evaluations within ``R0_TOLERANCE``).
    fit_upto: one compute for all variants, or one per variant (variants with their own budget).
    A variant that cannot be fitted (flat, too few points) is in ``failed`` with the reason.
    """
    if pooling not in POOLING:
        raise FitError(f"pooling must be one of {', '.join(POOLING)}; got {pooling!r}")
    shared, r0 = _shared_r0(curves, pooling, share_r0)
    grids = dict(exclude_below=exclude_below, a_grid=a_grid, cmid_grid=cmid_grid)
    fits, failed = _fit_each(curves, r0, fit_upto, grids)
    settings = dict(
        pooling=pooling,
        share_r0=share_r0,
        exclude_below=exclude_below,
        fit_upto=fit_upto,
        a_grid=a_grid,
        cmid_grid=cmid_grid,
    )
    out = CampaignFit({}, failed, pooling, r0_shared=bool(shared), r0=r0, inputs=curves, settings=settings)
    if pooling == "none":
        out.fits = {v: _with_params(f, f.A, f.B, f.C_mid, None) for v, f in fits.items()}
        for v, f in fits.items():  # exactly fit_sigmoid's numbers and notes
            out.fits[v].sse, out.fits[v].grid_A, out.fits[v].grid_C_mid = f.sse, f.grid_A, f.grid_C_mid
            out.fits[v].warnings = list(f.warnings)
        return out
    grid = fine_grid(LOGB_GRID)
    pool = deviation_pool(fits) if fits else None
    loglik, temps = _likelihoods(out, fits, pool, grid)
    members, notes = _members(out, fits, pool, loglik, grid)
    for v, f in fits.items():
        if v in members:
            prior = Prior(out.mu, out.tau, temps[v])
            sse, a, lcm = out.profiles[v]
            post = -sse / (2 * prior.temperature) - 0.5 * ((LOGB_GRID - out.mu) / out.tau) ** 2
            i = int(np.argmax(post))
            out.fits[v] = _polish_penalized(f, prior, a[i], LOGB_GRID[i], lcm[i])
            out.loglik[v] = loglik[v]
        else:
            out.fits[v] = _with_params(f, f.A, f.B, f.C_mid, None, notes.get(v, ""))
            out.fits[v].warnings = list(f.warnings)
    return out


def _shared_r0(curves: Mapping[str, tuple], pooling: str, share_r0: bool | None) -> tuple[bool, float | None]:
    """Whether the variants share one R0 (``share_r0``, or decided from the zero-compute evaluations)
    and its value, the mean of those evaluations."""
    zero = _zero_compute_means(curves)
    shared = (
        share_r0
        if share_r0 is not None
        else (len(zero) == len(curves) and len(zero) > 1 and max(zero.values()) - min(zero.values()) <= R0_TOLERANCE)
    )
    if pooling == "none":
        shared = False
    if not shared:
        return shared, None
    points = [np.asarray(y, float)[np.asarray(c, float) == 0] for v, (c, y, _) in curves.items() if v in zero]
    return shared, float(np.mean(np.concatenate(points)))


def _fit_each(
    curves: Mapping[str, tuple], r0: float | None, fit_upto: float | Mapping[str, float] | None, grids: dict
) -> tuple[dict[str, SigmoidFit], dict[str, str]]:
    """Each variant's own fit (``grids``: ``fit_sigmoid``'s exclude_below, a_grid and cmid_grid),
    and the reason of each that could not be fitted."""
    fits: dict[str, SigmoidFit] = {}
    failed: dict[str, str] = {}
    for v, (c, y, runs) in curves.items():
        upto = fit_upto.get(v) if isinstance(fit_upto, Mapping) else fit_upto
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fits[v] = fit_sigmoid(c, y, runs=runs, r0=r0, fit_upto=upto, **grids)
        except FitError as e:
            failed[v] = e.why
    return fits, failed


def _likelihoods(
    out: CampaignFit, fits: dict[str, SigmoidFit], pool, grid: np.ndarray
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Each variant's log-likelihood of log B on ``grid`` and its temperature, matched to the seed
    bootstrap; its B profile in ``out.profiles``."""
    loglik, temps = {}, {}
    rng = np.random.default_rng(0)
    for v, f in fits.items():
        log_c, y = _fit_points(f)
        a_range, c_range = _ranges(f)
        prof = profile_b(log_c, y, f.R0, LOGB_GRID, a_range, c_range)
        out.profiles[v] = prof
        temps[v] = temperature(f)
        loglik[v] = _interp_rows(LOGB_GRID, -(prof[0] - prof[0].min()) / (2 * temps[v]), grid)
        # the likelihood is as wide as the seeds make B: its temperature matched to the seed bootstrap
        ratio = (_bootstrap_logb_sd(f, pool, rng, CALIBRATION_RESAMPLES) / _likelihood_sd(loglik[v], grid)) ** 2
        ratio = float(np.clip(ratio, 1.0 / TEMPERATURE_RANGE, TEMPERATURE_RANGE))
        temps[v] *= ratio
        loglik[v] = loglik[v] / ratio
    return loglik, temps


def _members(
    out: CampaignFit, fits: dict[str, SigmoidFit], pool, loglik: dict[str, np.ndarray], grid: np.ndarray
) -> tuple[list[str], dict[str, str]]:
    """The variants that pool their B (none where fewer than two are left), with the campaign's
    hyperparameters in ``out``, and why each other one is fitted alone: a collapsing curve, or a B
    unlike the campaign's (removed one at a time, the worst first)."""
    notes: dict[str, Reason] = {}
    for v, f in fits.items():  # a curve that rises then falls has no sigmoid's B to lend or borrow
        why = collapse_reason(f, pool, len(np.unique(f.run_inputs)))
        if why:
            notes[v] = Reason("collapse", why.numbers, {"form": "alone"})
    members = [v for v in fits if v not in notes]
    mu = tau = tau_logpost = None
    while len(members) >= 2:
        mu, tau, tau_logpost = estimate_hyper(np.array([loglik[v] for v in members]), grid)
        z = {}
        for v in members:
            own = grid[int(np.argmax(loglik[v]))]
            z[v] = (own - mu) / np.hypot(tau, _likelihood_sd(loglik[v], grid))
        worst = max(members, key=lambda v: abs(z[v]))
        if abs(z[worst]) <= OUTLIER_Z:
            break
        own_b = float(np.exp(grid[int(np.argmax(loglik[worst]))]))
        members.remove(worst)
        notes[worst] = Reason("unlike", {"B": own_b, "campaign_B": float(np.exp(mu)), "z": z[worst]})
    if len(members) < 2:
        mu = tau = tau_logpost = None
        members = []
    out.mu, out.tau, out.tau_logpost = mu, tau, tau_logpost
    return members, notes

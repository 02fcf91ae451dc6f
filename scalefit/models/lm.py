"""Levenberg–Marquardt over a batch of independent least-squares problems.

One NumPy call per iteration solves thousands of small problems at once (every cell
of the (A, C_mid) grid, every bootstrap resample), instead of a Python loop of
``curve_fit`` calls. Rows that have converged leave the batch, so late iterations
only touch the few problems still moving.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# fun(theta_rows, row_indices) -> residuals (rows, n) and Jacobian (rows, n, p), arrays of its own
# (batched_lm keeps them and writes the rows whose step it refuses into them); a Jacobian that is
# a (p, rows, n) array seen as (rows, n, p), as sigmoid_residuals returns, is used without a copy
Residuals = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def batched_lm(
    fun: Residuals,
    theta: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    iters: int = 200,
    rtol: float = 1e-10,
) -> tuple[np.ndarray, np.ndarray]:
    """Minimise ``sum(r**2)`` independently for each row of ``theta`` (batch, p).

    Parameters stay inside ``[lower, upper]``; one on its bound that the descent pushes outward
    is held there for the step (projected Newton), so an optimum on a bound is reached rather
    than crawled towards. Returns the optimised parameters and each row's sum of squares.
    """
    theta = np.clip(np.array(theta, dtype=float), lower, upper)
    sse_out = np.empty(len(theta))
    rows = np.arange(len(theta))
    r, J = fun(theta, rows)
    J = _by_parameter(J)
    sse = np.einsum("bn,bn->b", r, r)
    lam = np.full(len(rows), 1e-3)
    eye = np.eye(theta.shape[1])
    fixed = lower == upper
    for _ in range(iters):
        JtJ = np.einsum("ibn,jbn->bij", J, J)
        g = np.einsum("ibn,bn->bi", J, r)
        # Marquardt's scaled damping plus a tiny absolute ridge, so H stays invertible when a
        # parameter has no effect on the residuals (e.g. B when A equals R0).
        H = JtJ + lam[:, None, None] * np.einsum("bii->bi", JtJ)[:, :, None] * eye + 1e-12 * eye
        # a parameter on its bound whose descent direction points outside stays there this step
        # (projected Newton): the others take the step that holds it fixed, not a clipped one.
        # A parameter whose bounds are equal is always held.
        th = theta[rows]
        pinned = ((th <= lower) & (g > 0)) | ((th >= upper) & (g < 0)) | fixed
        if pinned.any():
            free = ~pinned
            H = H * (free[:, :, None] & free[:, None, :]) + pinned[:, :, None] * eye
            g = np.where(pinned, 0.0, g)
        cand = np.clip(th - np.linalg.solve(H, g[..., None])[..., 0], lower, upper)
        r_new, J_new = fun(cand, rows)
        J_new = _by_parameter(J_new)
        sse_new = np.einsum("bn,bn->b", r_new, r_new)
        better = np.isfinite(sse_new) & (sse_new < sse)
        gain = np.where(better, sse - sse_new, 0.0)
        theta[rows[better]] = cand[better]
        worse = ~better  # most steps are taken: the few rows that stay move into the new arrays, not the reverse
        if worse.any():
            r_new[worse], J_new[:, worse], sse_new[worse] = r[worse], J[:, worse], sse[worse]
        r, J, sse = r_new, J_new, sse_new
        lam = np.clip(np.where(better, lam / 3.0, lam * 4.0), 1e-12, 1e16)
        done = (better & (gain <= rtol * sse)) | (~better & (lam > 1e10))
        done |= pinned.all(axis=1)  # every parameter held on a bound: a constrained optimum, no step left
        sse_out[rows[done]] = sse[done]
        if done.any():
            keep = np.flatnonzero(~done)  # ``take`` by index: a boolean mask on J's middle axis copies slower
            rows, r, J, sse, lam = rows[keep], r.take(keep, axis=0), J.take(keep, axis=1), sse[keep], lam[keep]
        if len(rows) == 0:
            break
    sse_out[rows] = sse
    return theta, sse_out


def _by_parameter(J: np.ndarray) -> np.ndarray:
    """The Jacobian (rows, n, p) as a contiguous (p, rows, n) array: NumPy's sums over points
    run an order of magnitude faster on it (a copy only where ``fun`` built it point-major)."""
    return np.ascontiguousarray(J.transpose(2, 0, 1))

"""The ScaleRL compute→performance curve (paper Eq. 1) and the power-law baseline."""

from __future__ import annotations

import numpy as np
from scipy.special import expit


def sigmoid(compute, A: float, B: float, C_mid: float, R0: float) -> np.ndarray:
    """R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B); R(0) = R0."""
    c = np.asarray(compute, dtype=float)
    with np.errstate(divide="ignore"):
        z = B * (np.log(C_mid) - np.log(c))
    return R0 + (A - R0) * expit(-z)


def sigmoid_residuals(
    theta: np.ndarray, log_c, y, r0, wrt: tuple[int, ...] = (0, 1, 2)
) -> tuple[np.ndarray, np.ndarray]:
    """Residuals R(C) - y and their Jacobian in (A, B, log C_mid), one row per row of ``theta``.

    ``log_c``, ``y`` and ``r0`` broadcast against (rows, points): shared points as (1, n),
    resampled points as (rows, n), a fixed R0 as a scalar or one per row as (rows, 1).
    ``wrt`` picks the Jacobian's columns (0 A, 1 B, 2 log C_mid): ``(0, 2)`` where B is held
    fixed. This is the one least-squares problem every refit of the curve solves.
    """
    if not set(wrt) <= {0, 1, 2}:
        raise ValueError(f"wrt = {wrt}: the columns are 0 (A), 1 (B) and 2 (log C_mid)")
    a, b, lc = theta[:, :1], theta[:, 1:2], theta[:, 2:3]
    u = lc - log_c
    shape = np.broadcast_shapes(u.shape, np.shape(y))
    jac = np.empty((len(wrt), *shape))  # one contiguous block per parameter (see scalefit.models.lm)
    # the curve's arithmetic, written into as few arrays as it can be (the bootstrap's refits spend most
    # of their time here): s straight into A's column, -gain * s shared by the residual and the slope
    x = np.multiply(-b, u, out=None if 1 in wrt else u)
    s = expit(x, out=jac[wrt.index(0)] if 0 in wrt else x)
    neg_gs = np.multiply(-(a - r0), s)  # -gain * s
    ds = np.multiply(neg_gs, np.subtract(1.0, s))  # -gain * s * (1 - s)
    r = np.subtract(np.subtract(r0, neg_gs, out=neg_gs), y, out=neg_gs)  # r0 + gain * s - y
    for k, col in enumerate(wrt):
        if col in (1, 2):
            np.multiply(ds, u if col == 1 else b, out=jac[k])
    return r, jac.transpose(1, 2, 0)


def power_law(compute, A: float, D: float, B: float) -> np.ndarray:
    """Saturating power law A - D / C^B (paper App. A.7's comparison)."""
    c = np.asarray(compute, dtype=float)
    with np.errstate(divide="ignore"):
        return A - D * np.exp(-B * np.log(c))

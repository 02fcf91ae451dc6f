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


def power_law(compute, A: float, D: float, B: float) -> np.ndarray:
    """Saturating power law A - D / C^B (paper App. A.7's comparison)."""
    c = np.asarray(compute, dtype=float)
    with np.errstate(divide="ignore"):
        return A - D * np.exp(-B * np.log(c))

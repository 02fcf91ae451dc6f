"""The paper's fitting procedure written the obvious way: one curve_fit per grid cell.

The reference that ``scalefit.fit_sigmoid`` is checked against (tests) and timed
against (``make bench-fit``).
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit

from scalefit.models.curve import sigmoid


def naive_fit(compute, value, r0: float, a_grid, cmid_grid) -> dict[str, float]:
    """Return the best cell: for each (A, C_mid) fit B with curve_fit (default start), lowest SSE wins."""
    c, v = np.asarray(compute, float), np.asarray(value, float)
    best = {"sse": np.inf}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimizeWarning)
        for A in a_grid:
            for C_mid in cmid_grid:

                def model(x, b, A=A, C_mid=C_mid):
                    return sigmoid(x, A, b, C_mid, r0)

                try:
                    (B,), _ = curve_fit(model, c, v, p0=[1.0])
                except RuntimeError:
                    continue
                sse = float(np.sum((sigmoid(c, A, B, C_mid, r0) - v) ** 2))
                if sse < best["sse"]:
                    best = {"A": float(A), "B": float(B), "C_mid": float(C_mid), "sse": sse}
    return best

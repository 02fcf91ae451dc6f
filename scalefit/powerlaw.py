"""The saturating power law A - D / C^B fitted the same way, as an honesty baseline.

The paper (App. A.7) shows that a power law fitted to a run that saturates near 0.65
predicts an asymptote of 1.0. Fitting both on the same points lets users see whether
their data says the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scalefit.curve import power_law
from scalefit.fit import check_curve
from scalefit.lm import batched_lm

POWER_LAW_A_GRID = np.round(np.arange(0.450, 1.0 + 1e-9, 0.005), 3)


@dataclass
class PowerLawFit:
    A: float
    D: float
    B: float
    sse: float

    def predict(self, compute) -> np.ndarray:
        return power_law(compute, self.A, self.D, self.B)

    def to_dict(self) -> dict[str, float]:
        return {"A": self.A, "D": self.D, "B": self.B, "sse": self.sse}


def fit_power_law(
    compute, value, *, exclude_below: float | None = None, fit_upto: float | None = None, a_grid=None
) -> PowerLawFit:
    """Grid-search A (default 0.450..1.000), fit D and B per cell, keep the lowest SSE."""
    c, v = check_curve(compute, value)
    keep = c > 0
    if exclude_below is not None:
        keep &= c >= exclude_below
    if fit_upto is not None:
        keep &= c <= fit_upto
    log_c, y = np.log(c[keep]), v[keep]
    a = POWER_LAW_A_GRID if a_grid is None else np.atleast_1d(np.asarray(a_grid, float))

    # Start each cell from the straight line log(A - y) = log D - B log C.
    gap = np.log(np.clip(a[:, None] - y[None, :], 1e-4, None))
    slope = np.polyfit(log_c, gap.T, 1)
    theta0 = np.stack([slope[1], np.clip(-slope[0], 1e-3, 10.0)], axis=1)

    def residuals(theta: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        log_d, b = theta[:, :1], theta[:, 1:2]
        t = np.exp(log_d - b * log_c)
        r = a[rows, None] - t - y
        return r, np.stack([-t, t * log_c], axis=-1)

    theta, sse = batched_lm(residuals, theta0, np.array([-50.0, 1e-4]), np.array([50.0, 20.0]))
    i = int(np.argmin(sse))
    return PowerLawFit(A=float(a[i]), D=float(np.exp(theta[i, 0])), B=float(theta[i, 1]), sse=float(sse[i]))

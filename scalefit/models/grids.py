"""Search grids for A and C_mid (paper §2.1 / App. A.5) and their parsing."""

from __future__ import annotations

import numpy as np

from scalefit.errors import FitError

PAPER_A_GRID = np.round(np.arange(0.450, 0.800 + 1e-9, 0.005), 3)
PAPER_CMID_GRID = np.linspace(100.0, 40000.0, 100)


def auto_cmid_grid(compute_max: float, n: int = 100) -> np.ndarray:
    """C_mid values scaled to the data: ``n`` linear values over [C_max / 100, 4 C_max].

    The paper's [100, 40000] assumes GPU-hours; compute may be seconds, tokens or FLOPs.
    """
    return np.linspace(compute_max / 100.0, 4.0 * compute_max, n)


def parse_grid(spec: str, *, name: str, kind: str) -> np.ndarray:
    """Parse ``LO:HI:STEP`` (A) or ``LO:HI:N`` (C_mid, linear) from the command line."""
    parts = spec.split(":")
    try:
        lo, hi, third = (float(p) for p in parts)
    except ValueError:
        raise FitError(f"{name}: expected LO:HI:{'STEP' if kind == 'step' else 'N'}, got {spec!r}") from None
    if not 0 < lo < hi:
        raise FitError(f"{name}: need 0 < LO < HI, got {spec!r}")
    if kind == "step":
        if third <= 0:
            raise FitError(f"{name}: STEP must be positive, got {spec!r}")
        return np.round(np.arange(lo, hi + third / 2, third), 6)
    if third < 2 or third != int(third):
        raise FitError(f"{name}: N must be an integer >= 2, got {spec!r}")
    return np.linspace(lo, hi, int(third))

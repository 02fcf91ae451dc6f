"""Plot data, fitted curve, extrapolation and bootstrap band."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from scalefit.fit import SigmoidFit  # noqa: E402
from scalefit.uncertainty import Bootstrap  # noqa: E402


def plot_fits(
    fits: Mapping[str, SigmoidFit],
    path: str | Path,
    *,
    boots: Mapping[str, Bootstrap] | None = None,
    xlabel: str = "compute",
    ylabel: str = "mean@16",
    title: str | None = None,
) -> Path:
    """One figure with each curve's points, its fit (solid up to fit_upto, dashed beyond) and band."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, (name, f) in enumerate(fits.items()):
        color = f"C{i % 10}"
        c_all, v_all = f.inputs
        c_hi = max(c_all.max(), f.C_mid) * 1.5
        grid = np.linspace(max(c_all[c_all > 0].min(), 1e-12) / 2, c_hi, 400)
        ax.scatter(c_all, v_all, s=9, color=color, alpha=0.45, linewidths=0)
        if len(f.heldout_compute):
            ax.scatter(
                f.heldout_compute, f.heldout_value, s=18, facecolors="none", edgecolors=color, label=f"{name}: held out"
            )
        cut = f.compute.max()
        seen, beyond = grid <= cut, grid >= cut
        ax.plot(
            grid[seen], f.predict(grid[seen]), color=color, label=f"{name}: A={f.A:.3f} B={f.B:.2f} C_mid={f.C_mid:.3g}"
        )
        ax.plot(grid[beyond], f.predict(grid[beyond]), color=color, ls="--")
        if boots and name in boots:
            lo, hi = boots[name].predict_interval(grid)
            ax.fill_between(grid, lo, hi, color=color, alpha=0.15, linewidth=0)
        ax.axhline(f.A, color=color, lw=0.6, ls=":")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path

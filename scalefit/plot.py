"""Plot data, fitted curves, extrapolation, and the two bands: confidence (the mean curve) and
prediction (where an evaluation lands)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from scalefit.forecast import Forecast  # noqa: E402
from scalefit.model import CurveFit  # noqa: E402


def plot_fits(
    fits: Mapping[str, CurveFit],
    path: str | Path,
    *,
    forecasts: Mapping[str, Forecast] | None = None,
    xlabel: str = "compute",
    ylabel: str = "mean@16",
    title: str | None = None,
    log_x: bool = True,
    unfitted: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> Path:
    """One figure with each curve's points, its fit (solid up to fit_upto, dashed beyond), its
    confidence band (dark) and prediction band (light); held-out points as open circles.

    A fit whose forecast is not yet predictable is drawn as points with a dotted curve and the
    verdict in its label; a fit whose optimum sits on a grid edge as points only, and so is each
    curve in ``unfitted`` (name → compute, values: a curve with no fit at all, e.g. a flat one),
    so no measured curve is missing from the figure. Compute is on a log scale, as in the paper.
    """
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (name, f) in enumerate(fits.items()):
        color = f"C{i % 10}"
        c_all, v_all = f.inputs
        pos = c_all[c_all > 0]
        lo_c = max(pos.min(), 1e-12) / 1.5
        hi_c = max(c_all.max(), f.compute.max() * 2) * 1.2
        grid = np.geomspace(lo_c, hi_c, 300) if log_x else np.linspace(lo_c, hi_c, 300)
        ax.scatter(c_all[f.used], v_all[f.used], s=10, color=color, alpha=0.6, linewidths=0)
        if len(f.heldout_compute):
            ax.scatter(
                f.heldout_compute, f.heldout_value, s=20, facecolors="none", edgecolors=color, label=f"{name}: held out"
            )
        if f.not_identified:  # no identified optimum: its curve would be an artefact
            ax.scatter([], [], s=10, color=color, label=f"{name}: no identifiable fit (grid edge or bound)")
            continue
        fc = forecasts.get(name) if forecasts else None
        ok = fc is None or fc.verdict is None or fc.verdict.predictable
        label = f"{name}: {f.describe()}"
        if not ok:
            label += " — not yet predictable"
        cut = f.compute.max()
        seen, beyond = grid <= cut, grid >= cut
        ax.plot(grid[seen], f.predict(grid[seen]), color=color, label=label, ls="-" if ok else ":")
        ax.plot(grid[beyond], f.predict(grid[beyond]), color=color, ls="--" if ok else ":")
        if fc is not None:
            plo, phi = fc.prediction_band(grid)
            clo, chi = fc.confidence_band(grid)
            ax.fill_between(grid, plo, phi, color=color, alpha=0.10, linewidth=0)
            ax.fill_between(grid, clo, chi, color=color, alpha=0.25, linewidth=0)
        if f.has_asymptote:
            ax.axhline(f.params["A"], color=color, lw=0.6, ls=":")
    for j, (name, (c, v)) in enumerate((unfitted or {}).items()):
        ax.scatter(c, v, s=10, color=f"C{(len(fits) + j) % 10}", alpha=0.6, marker="x", label=f"{name}: no fit")
    if forecasts:
        level = next(iter(forecasts.values())).level
        ax.fill_between([], [], [], color="grey", alpha=0.25, label=f"{level:.0%} confidence band (mean curve)")
        ax.fill_between([], [], [], color="grey", alpha=0.10, label=f"{level:.0%} prediction band (an evaluation)")
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel + (" (log scale)" if log_x else ""))
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path

"""Plot data, fitted curves, extrapolation, and the two bands: confidence (the mean curve) and
prediction (where an evaluation lands)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from scalefit.forecasts.single import Forecast  # noqa: E402
from scalefit.models.base import CurveFit  # noqa: E402

MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "*")  # one a curve, so overlapping curves stay apart


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
    flagged: tuple[np.ndarray, np.ndarray] | None = None,
    notes: Mapping[str, str] | None = None,
) -> Path:
    """One figure with each curve's points, its fit (solid up to fit_upto, dashed beyond), its
    confidence band (dark) and, where its forecast is predictable, its prediction band (light);
    held-out points as open circles.

    A fit whose forecast is not yet predictable is drawn as points with a dotted curve and the
    verdict in its label; a fit whose optimum sits on a grid edge as points only, and so is each
    curve in ``unfitted`` (name → compute, values: a curve with no fit at all, e.g. a flat one),
    so no measured curve is missing from the figure; ``flagged`` (compute, values: evaluations left
    out of the fits as unstable, ``scalefit.data.unstable``) are drawn as red crosses; ``notes`` (name →
    a few words, e.g. its reading "slower, ceiling not yet told") end a curve's legend label. Compute
    is on a log scale, as in the paper.
    Each curve has its own colour and marker (curves that overlap stay apart), the legend sits
    outside the axes, and the y-range is the measured values' (not a fixed 0-1) plus the drawn
    asymptotes inside [0, 1].
    """
    fig, ax = plt.subplots(figsize=(11, 5))
    shown: list[np.ndarray] = []  # every value drawn as a point or asymptote: the y-range
    banded = False  # a prediction band drawn (predictable fits only: overlapping wide bands hide the data)
    for i, (name, f) in enumerate(fits.items()):
        fc = forecasts.get(name) if forecasts else None
        banded |= _draw_fit(ax, i, name, f, fc, (notes or {}).get(name), log_x, shown)
    for j, (name, (c, v)) in enumerate((unfitted or {}).items()):
        k = len(fits) + j
        ax.scatter(c, v, s=14, color=f"C{k % 10}", alpha=0.6, marker=MARKERS[k % len(MARKERS)], label=f"{name}: no fit")
        shown.append(np.asarray(v, dtype=float))
    if flagged is not None and len(flagged[0]):
        ax.scatter(*flagged, s=40, color="red", marker="x", label="unstable run (left out of the fit)")
        shown.append(np.asarray(flagged[1], dtype=float))
    if forecasts:
        level = next(iter(forecasts.values())).level
        ax.fill_between([], [], [], color="grey", alpha=0.25, label=f"{level:.0%} confidence band (mean curve)")
        if banded:
            label = f"{level:.0%} prediction band (an evaluation; predictable fits only)"
            ax.fill_between([], [], [], color="grey", alpha=0.10, label=label)
    _axes(ax, shown, xlabel, ylabel, title, log_x)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)  # beside the data
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path


def _draw_fit(
    ax, i: int, name: str, f: CurveFit, fc: Forecast | None, note: str | None, log_x: bool, shown: list[np.ndarray]
) -> bool:
    """Curve ``i``'s points, fit, bands and asymptote (the values drawn added to ``shown``); whether
    a prediction band was drawn."""
    color, marker = f"C{i % 10}", MARKERS[i % len(MARKERS)]
    c_all, v_all = f.inputs
    pos = c_all[c_all > 0]
    lo_c = max(pos.min(), 1e-12) / 1.5
    hi_c = max(c_all.max(), f.compute.max() * 2) * 1.2
    grid = np.geomspace(lo_c, hi_c, 300) if log_x else np.linspace(lo_c, hi_c, 300)
    shown += [np.asarray(v_all[f.used], dtype=float), np.asarray(f.heldout_value, dtype=float)]  # as drawn
    points = ax.scatter(c_all[f.used], v_all[f.used], s=12, color=color, marker=marker, alpha=0.6, linewidths=0)
    if len(f.heldout_compute):
        ax.scatter(
            f.heldout_compute, f.heldout_value, s=20, facecolors="none", edgecolors=color, label=f"{name}: held out"
        )
    if f.not_identified:  # no identified optimum: its curve would be an artefact
        points.set_label(f"{name}: no identifiable fit (grid edge or bound)")
        return False
    ok = fc is None or fc.verdict is None or fc.verdict.predictable
    label = f"{name}: {f.describe()}"
    if not ok:
        label += " — not yet predictable"
    if note:
        label += f" — {note}"
    cut = f.compute.max()
    seen, beyond = grid <= cut, grid >= cut
    ax.plot(  # its marker shows in the legend only (markevery: none on the line)
        grid[seen],
        f.predict(grid[seen]),
        color=color,
        label=label,
        ls="-" if ok else ":",
        marker=marker,
        markersize=4,
        markevery=[],
    )
    ax.plot(grid[beyond], f.predict(grid[beyond]), color=color, ls="--" if ok else ":")
    banded = False
    if fc is not None:
        if ok:  # a forecast the verdict vouches for: where an evaluation lands
            plo, phi = fc.prediction_band(grid)
            ax.fill_between(grid, plo, phi, color=color, alpha=0.10, linewidth=0)
            banded = True
        clo, chi = fc.confidence_band(grid)
        ax.fill_between(grid, clo, chi, color=color, alpha=0.25, linewidth=0)
    ceiling = f.parameters.ceiling
    if ceiling is not None:
        ax.axhline(f.params[ceiling], color=color, lw=0.6, ls=":")
        shown.append(np.array([f.params[ceiling]]))
    return banded


def _axes(ax, shown: list[np.ndarray], xlabel: str, ylabel: str, title: str | None, log_x: bool) -> None:
    """Scale, labels, title and grid; the y-range the values drawn in [0, 1], padded."""
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel + (" (log scale)" if log_x else ""))
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    values = np.concatenate(shown) if shown else np.array([])
    values = values[np.isfinite(values) & (values >= 0) & (values <= 1)]
    if len(values):
        lo, hi = float(values.min()), float(values.max())
        pad = max(0.05 * (hi - lo), 0.01)
        ax.set_ylim(max(lo - pad, 0.0), min(hi + pad, 1.0))

"""A scale campaign's across-size fit: its curves with each run's size and parameter count (the
``sizes.csv`` that ``python -m scalefit sizes`` reads), the forecast of its largest size (or
``holdout``) from the others with the leave-one-size-out backtest (``sizes.md``), as data
(``sizes.json``) and the plot (``sizes.png``), written beside the per-size table that
``python -m analysis fit`` writes. Where a size's runs started from several base-model builds (the
``build`` column; a campaign's ``builds: N``), it is fitted build by build (``scalefit.sizes.builds``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from runners.contract import MEAN_AT_16
from runners.task.sizes import SIZES, parameter_count
from scalefit.data.outputs import write_json
from scalefit.errors import FitError
from scalefit.sizes import MIN_SIZES, backtest_sizes, fit_size, forecast_lines, forecast_size, plot_sizes, size_data

FORECAST_FILES = ("sizes.md", "sizes.json", "sizes.png")
SIZE_PREFIX = "size="  # a scale campaign's variants: size=NAME (runners.campaign.load.expand)


def scale_curves(curves: pd.DataFrame) -> pd.DataFrame:
    """``load_curves``' table with each row's size and that size's parameter count, both read from its
    variant (a ``sizes.csv`` this wrote, refitted, has them already: they are read again, not kept)."""
    size = curves["variant"].astype(str).str.removeprefix(SIZE_PREFIX)
    unknown = sorted(set(size[~size.isin(list(SIZES))]))
    if unknown:
        raise ValueError(f"variant {SIZE_PREFIX}{unknown[0]}: not an embedded size; is this a scale campaign's curves?")
    out = curves.drop(columns=["size", "parameters"], errors="ignore")
    out.insert(1, "size", size)
    out.insert(2, "parameters", size.map(parameter_count))
    return out


def write_sizes(
    curves: pd.DataFrame, out: Path, x: str, *, holdout: str | None = None, y: str = MEAN_AT_16
) -> list[str]:
    """Write ``sizes.csv``, and where there are enough sizes the forecast of ``holdout`` (default: the
    largest) with the backtest (``sizes.md``), as data (``sizes.json``) and the plot (``sizes.png``);
    returns what to print."""
    out.mkdir(parents=True, exist_ok=True)
    table = scale_curves(curves)
    table.to_csv(out / "sizes.csv", index=False)
    data = size_data(  # each run's base-model build, where recorded: a size of several is fitted build by build
        {
            k: (g["parameters"].iloc[0], g[x], g[y], g["seed"], g.get("build"))
            for k, g in table.dropna(subset=[x, y]).groupby("size")
        }
    )
    target = holdout or list(data)[-1]
    lines = [f"across sizes: {len(data)} size(s) in {out / 'sizes.csv'}"]
    for name in FORECAST_FILES:  # an earlier fit's forecast is never left to pass for this one's
        (out / name).unlink(missing_ok=True)
    if len(data) - (target in data) < MIN_SIZES + 1:
        lines.append(
            f"  no forecast: forecasting {target} needs {MIN_SIZES + 1} other sizes with fitted curves, this campaign"
            f" has {len(data) - (target in data)}; run more sizes (`python -m scalefit sizes` reads sizes.csv)"
        )
        return lines
    try:
        fits = {k: fit_size(k, d) for k, d in data.items() if k != target}
        fc = forecast_size(data, target, fits=fits)
    except FitError as e:
        return [*lines, f"  no forecast: {e}"]
    report = forecast_lines(fc)
    fitted = {k: d for k, d in data.items() if k != target}
    if len(fitted) > MIN_SIZES + 1:
        report += backtest_sizes(fitted, fits=fits).lines()
    (out / "sizes.md").write_text("```\n" + "\n".join(report) + "\n```\n")
    write_json(fc.to_dict(), str(out / "sizes.json"), quiet=True)
    plot_sizes(data, fc, out / "sizes.png")
    return [*lines, *report, f"  written: {out / 'sizes.md'}, {out / 'sizes.json'}, {out / 'sizes.png'}"]

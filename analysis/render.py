"""Render the LOO results, the fourth part of ``analysis fit``: the Markdown table (``to_markdown``),
the plot (``plot_campaign``) and the list of runs with their reports (``runs_markdown``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis import builds
from analysis.curves import bad_points, unstable_points
from runners.contract import MEAN_AT_16
from scalefit.forecasts.plot import plot_fits
from scalefit.forecasts.settings import FitSettings
from scalefit.models.registry import make_model


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _fmt(v: Any, spec: str) -> str:
    return "" if v is None or (isinstance(v, float) and np.isnan(v)) else format(v, spec)


def to_markdown(table: pd.DataFrame) -> str:
    """The LOO table as Markdown: a header (the fit model, the columns) and one row per variant."""
    k = next((int(c[len("final_last") : -len("_mean_at_16")]) for c in table if c.startswith("final_last")), 3)
    lines = []
    models = [m for m in table.get("fit_model", pd.Series(dtype=object)).dropna().unique() if m]
    if models:
        lines += [f"Fit: {models[0]}.", ""]
    if (base := builds.line(table)) is not None:
        lines += [base[0].upper() + base[1:] + ".", ""]
    fitted = table.get("model", pd.Series(dtype=object)).dropna()
    model = make_model(fitted.iloc[0] if len(fitted) else "sigmoid")
    names, top = model.param_names, model.parameters.asymptote  # the table's columns; A_lo/A_hi are top's
    heads = [f"{p} [interval]" if p == top and "A_lo" in table else p for p in names]
    lines += [
        f"| variant | {' | '.join(heads)} | final mean@16 (last " + str(k) + ") | predictable? "
        "| verdict vs baseline | call at half the budget → at the budget | measured at the budget (95%, seeds; "
        f"last {k}) | measured at half the budget | resolvable Δ (80%; last {k}) |",
        "|---|" + "---|" * len(names) + "---|---|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():
        pred = r.get("predictability", "")
        pred = "" if not isinstance(pred, str) else pred
        if not pd.isna(r.get("p_within", np.nan)):  # the number the verdict reads
            pred = f"P {r['p_within']:.2f}: {pred}"
        verdict = r.get("verdict", "")
        stopped = r.get("stopped")
        if isinstance(stopped, str) and stopped:  # the numbers are predictions, not observations
            verdict = f"{verdict} — {stopped} (prediction)" if verdict else f"{stopped} (prediction)"
        measured, half = _measured_cells(r, k)
        res = ""
        if not pd.isna(r.get("resolvable", np.nan)):
            res = f"{r['resolvable']:.3f} ({r['resolvable_last_k']:.3f})"
        lines.append(
            f"| {r['variant']} | {' | '.join(_param_cells(r, names, top))} | {_final_cell(r, k)} | {pred} "
            f"| {verdict} | "
            f"{_calls_cell(r)} | {measured} | {half} | {res} |"
        )
    return "\n".join(lines) + "\n"


def _param_cells(r: pd.Series, names: list[str], top: str | None = "A") -> list[str]:
    """A row's parameter cells (the ceiling or asymptote ``top`` with its interval, a grid edge or a
    bound marked); with no fit, the first one says why."""
    cells = []
    for p in names:
        if p == top:
            a = (
                f"{r[p]:.3f} [{r['A_lo']:.3f}, {r['A_hi']:.3f}]"
                if p in r and not pd.isna(r.get(p)) and not pd.isna(r.get("A_lo"))
                else (f"{r[p]:.3f}" + (" (no band)" if "A_lo" in r else "") if not pd.isna(r.get(p)) else "")
            )
            cells.append(a + (" (grid edge)" if r.get("a_at_edge") is True else ""))
        elif p == "B":
            cells.append(_fmt(r.get("B"), ".2f") + (" (bound)" if r.get("b_at_bound") is True else ""))
        else:
            cells.append(_fmt(r.get(p), ".3g"))
    if pd.isna(r.get(names[0])):  # no fit: the first parameter's cell says why
        cells[0] = r.get("note", "")
    return cells


def _final_cell(r: pd.Series, k: int) -> str:
    """The final mean@16 (and over the last k), with unfinished, dropped and unstable runs noted."""
    final = _fmt(r["final_mean_at_16"], ".3f")
    last = r.get(f"final_last{k}_mean_at_16")
    if last is not None and not pd.isna(last):
        final += f" ({last:.3f})"
    if r.get("unfinished", 0) > 0:  # a partial curve: its last value is not the run's final one
        final += f" ({r['unfinished']:.0f} of {r['seeds']} runs unfinished)"
    if _text(r.get("dropped")):  # points no curve can hold, left out of the fit by name
        final += f" ({r['dropped']})"
    if _text(r.get("unstable")):  # runs that left their siblings: counted and named
        final += f" (unstable: {r['unstable']}; flagged evaluations left out of the fit)"
    return final


def _calls_cell(r: pd.Series) -> str:
    """The call at half the budget → at the budget, and the reading (slower or lower) if any."""
    calls = ""
    if _text(r.get("half_call_text")) or _text(r.get("call_text")):
        calls = f"{_text(r.get('half_call_text'))} → {_text(r.get('call_text'))}"
    if _text(r.get("reading_text")):  # slower or lower, as the fit to all of it reads it
        calls += f" (reading at the budget: {r['reading']}: {r['reading_text']})"
    return calls


def _measured_cells(r: pd.Series, k: int) -> tuple[str, str]:
    """The measured comparisons at the budget and at half of it, each with its last-k version."""
    measured = _text(r.get("measured"))
    if _text(r.get(f"measured_last{k}")):
        measured += f" (last {k}: {_text(r.get(f'measured_last{k}'))})"
    if _text(r.get(f"steady_measured_last{k}")):  # a run was flagged: the comparison without it too
        measured += f" (without flagged runs, last {k}: {_text(r.get(f'steady_measured_last{k}'))})"
    half = _text(r.get("half_measured"))
    if _text(r.get(f"half_measured_last{k}")):
        half += f" (last {k}: {_text(r.get(f'half_measured_last{k}'))})"
    return measured, half


def plot_campaign(curves: pd.DataFrame, extra: dict, path: Path, settings: FitSettings, title: str = "") -> Path | None:
    """The LOO plot: every variant's points, and its fit with both bands where it has one (``extra``
    as ``fit_table`` returns it); a variant without a fit (flat, spliced) as points, never left out."""
    x = settings.x
    curves = bad_points(curves, x)[0]
    unfitted = {
        v: (g[x].to_numpy(), g[MEAN_AT_16].to_numpy()) for v, g in curves.groupby("variant") if v not in extra["fits"]
    }
    if not (extra["fits"] or unfitted):
        return None
    left_out = curves[unstable_points(curves)[0]]  # unstable runs' flagged evaluations
    table = extra.get("table")
    readings = {}  # each variant's reading (slower, lower, ...) beside its name in the legend
    if table is not None and "reading" in table:
        told = table[table["reading"].apply(lambda v: _text(v) not in ("", "cannot tell yet"))]
        readings = {r["variant"]: r["reading"] for _, r in told.iterrows()}
    return plot_fits(
        extra["fits"],
        path,
        forecasts=extra["forecasts"],
        xlabel=x,
        title=f"{title}: mean@16 vs compute, {settings.model.replace('_', ' ')} fits" if title else None,
        unfitted=unfitted,
        flagged=(left_out[x].to_numpy(float), left_out[MEAN_AT_16].to_numpy(float)),
        notes=readings,
    )


def report_folder(out: Path, variant: str, seed: int) -> Path:
    """Where ``analysis fit`` keeps a run's report beside the table (``out/reports/<variant>-seed<n>``)."""
    return out / "reports" / f"{variant}-seed{seed}".replace("=", "-").replace("/", "-")


def runs_markdown(curves: pd.DataFrame, out: Path) -> str:
    """One line per run with its last mean@16 and a link to its report, relative to ``out`` (where
    ``runs.md`` is written: the link opens in any Markdown viewer of the folder)."""
    lines = ["| run | variant | seed | status | last mean@16 | report |", "|---|---|---|---|---|---|"]
    for run_id, g in curves.groupby("run_id", sort=False):
        g = g.sort_values("step")
        report = report_folder(out, g["variant"].iloc[0], g["seed"].iloc[0]) / "report.md"
        if report.is_file():
            link = f"[{report.parent.name}]({report.relative_to(out).as_posix()})"
        else:
            link = "none (`make report RUN=" + run_id + "`)"
        stopped = g["stopped"].iloc[0] if "stopped" in g else ""
        status = (
            f"stopped {stopped}"
            if isinstance(stopped, str) and stopped
            else ("done" if g["done"].iloc[0] else "running")
        )
        lines.append(
            f"| {g['run'].iloc[0]} | {g['variant'].iloc[0]} | {g['seed'].iloc[0]} | {status} | "
            f"{g[MEAN_AT_16].iloc[-1]:.3f} | {link} |"
        )
    return "\n".join(lines) + "\n"

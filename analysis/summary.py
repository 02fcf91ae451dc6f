"""The terminal summary of a LOO table: what ``analysis fit`` (``make fit``, ``make ablation``) prints.

One line per variant within ``WIDTH`` columns (A, Δ against the baseline with its interval, the
call, one short reason), then where the full table, the plot and the curves in MLflow's UI are.
The Markdown table (``analysis.loo.to_markdown``) keeps every number and every reason in full.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis import builds

WIDTH = 100  # columns: every line but a UI address, which is printed alone on its line to stay one link
A_W, P_W, DELTA_W, CALL_W = 5, 3, 25, 15  # the variant's column is as wide as its longest name (8 to 24)


def _num(v: Any) -> float | None:
    """A table cell as a finite number, or None (NaN, missing, text)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _true(v: Any) -> bool:
    """A flag cell that is set (a missing one, NaN for a variant without a fit, is not)."""
    return isinstance(v, bool | np.bool_) and bool(v)


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` columns, cut with an ellipsis."""
    return text if len(text) <= width else text[: max(width - 1, 0)].rstrip() + "…"


def _short(r: pd.Series, column: str) -> str:
    """A reason's short form as the table carries it (``<column>_short``: ``scalefit.reasons.Reason.short``,
    rendered from the reason's kind and numbers, never parsed from its text); empty where the table
    has none (a table written before reasons were data, or a reason that is only text)."""
    return _text(r.get(f"{column}_short"))


def _said(head: str, short: str) -> str:
    """``head``, then ``short`` after a colon where there is one."""
    return f"{head}: {short}" if short else head


def _measured(r: pd.Series, k: int, prefix: str = "") -> tuple[str, str]:
    """The measured difference of the seeds' means (last ``k`` evaluations) with its interval, and its
    label (``prefix`` "steady_": the comparison without the flagged runs)."""
    d, lo, hi = (_num(r.get(f"{prefix}measured_last{k}_{c}")) for c in ("delta", "lo", "hi"))
    if d is None:
        return "", ""
    cell = f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" if lo is not None and hi is not None else f"{d:+.3f}"
    return cell, _text(r.get(f"{prefix}measured_last{k}_label"))


def _baseline_why(r: pd.Series) -> str:
    """What the baseline's line says after its A: how far its own fit can be trusted."""
    if _true(r.get("a_at_edge")):
        return f"reference, A = {_num(r.get('A')):.3f} on its grid edge: not identified, so no fitted call"
    if _num(r.get("A")) is None:
        return _said("reference, no fit", _short(r, "note"))
    if _true(r.get("predictable")):
        return "reference, predictable"
    return _said("reference, not yet predictable", _short(r, "predictability"))


def _variant_line(r: pd.Series, margin: float, k: int) -> tuple[str, str, str]:
    """Δ, call and reason cells of a variant: the call at the budget with the fits' Δ, or, where the
    fits give none, the measured Δ (marked m) and what it says."""
    call = _text(r.get("call")) or "cannot tell yet"
    d, lo, hi = (_num(r.get(c)) for c in ("call_delta", "call_lo", "call_hi"))
    m_cell, m_label = _measured(r, k)
    cell = f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" if None not in (d, lo, hi) else (m_cell + " m" if m_cell else "")
    if _true(r.get("identical_to_baseline")):
        why = "axis did not act (same curve)"
    elif call == "worse" and _short(r, "call"):  # not the fits' interval: bounded by its data (``Bound.short``)
        why = ("no fit; " if _num(r.get("A")) is None else "") + _short(r, "call")
    elif call == "worse":
        why = f"its interval is below -{margin:g}"
    elif call == "better":
        why = f"its interval is above +{margin:g}"
    elif call == "no difference":
        why = f"its interval is inside ±{margin:g}"
    elif m_label in ("worse", "better") or m_label.startswith("within"):
        measured = f"measured: {m_label.replace('within the margin', 'within')}"
        if _num(r.get("A")) is None:
            why = f"no fit; {measured}"
        else:
            why = f"{measured}; " + (
                f"fit: crosses ±{margin:g}" if d is not None else _short(r, "call") or "fit: cannot tell yet"
            )
    elif d is not None:
        why = f"its interval crosses ±{margin:g}"
    elif _num(r.get("A")) is None:
        why = _said("no fit", _short(r, "note"))
    else:
        why = _short(r, "call") or _text(r.get("call_text"))
    if _text(r.get("reading")) and r["reading"] != "cannot tell yet":  # slower or lower, first
        why = f"{r['reading']}; {why}"
    return cell, call, why


def _row(width: int, name: str, a: str, p: str, why: str, delta: str | None = None, call: str = "") -> str:
    """One line: the variant, its A and P (``Forecast.p_within``), then its Δ and call (none: the
    reason takes their columns)."""
    head = f"{_cut(name, width):<{width}} {a:>{A_W}} {p:>{P_W}} "
    if delta is not None:
        head += f"{delta:<{DELTA_W}}  {call:<{CALL_W}}  "
    return head + _cut(why, WIDTH - len(head))


def _unstable_line(table: pd.DataFrame) -> list[str]:
    """One line naming each variant's collapsed runs ("baseline: 1 of 4 runs collapsed"), or none."""
    rows = [r for _, r in table.iterrows() if _text(r.get("unstable"))]
    said = [f"{r['variant']}: {_text(r['unstable']).split(': ')[0]}" for r in rows]
    return [_cut("unstable runs (left out of the fit, named in the table): " + "; ".join(said), WIDTH)] if said else []


def _steady_lines(table: pd.DataFrame, k: int) -> list[str]:
    """Where a run was flagged, each comparison it touched measured without the flagged runs, a line each."""
    out = []
    for _, r in table.iterrows():
        cell, label = _measured(r, k, "steady_")
        if cell:
            said = label.replace("within the margin", "within")
            out.append(_cut(f"without flagged runs: {r['variant']} measured {cell} {said}", WIDTH))
    return out


def _where(path: Path) -> str:
    """A path as short as it can be said: relative to the working folder when it lies under it."""
    try:
        return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd().resolve()) else str(path)
    except ValueError:  # another drive
        return str(path)


def summary(
    table: pd.DataFrame,
    out: Path,
    *,
    margin: float,
    title: str = "",
    ui: tuple[str, str] | None = None,
) -> str:
    """The terminal summary of ``table`` (as ``fit_table`` returns it) written under ``out``.

    ``ui``: (how to reach it, the campaign's address in MLflow's UI), or None (fitted from a
    curves.csv: no store). Every line fits ``WIDTH`` columns but the address, printed alone.
    """
    k = next((int(c[len("final_last") : -len("_mean_at_16")]) for c in table if c.startswith("final_last")), 3)
    w = min(max([8, *(len(str(v)) for v in table["variant"])]), 24)
    head = f"each variant against the baseline at the budget, margin ±{margin:g}"
    lines = [
        _cut(f"{title}: {head}" if title else head, WIDTH),
        _row(w, "variant", "A", "P", "why", "Δ [95% interval]", "call"),
    ]
    for _, r in table.iterrows():
        a = _num(r.get("A"))
        a_cell = "—" if a is None else f"{a:.3f}"
        p = _num(r.get("p_within"))
        p_cell = "—" if p is None else ("1" if p >= 0.995 else f"{p:.2f}".lstrip("0"))  # .84: P_W wide
        delta, call, why = (None, "", _baseline_why(r)) if r["variant"] == "baseline" else _variant_line(r, margin, k)
        if (_num(r.get("unfinished")) or 0) > 0:
            why = f"{int(r['unfinished'])} of {int(r['seeds'])} runs unfinished; {why}"
        lines.append(_row(w, str(r["variant"]), a_cell, p_cell, why, delta, call))
    if "unstable" in table:
        lines += _unstable_line(table) + _steady_lines(table, k)
    if (base := builds.line(table)) is not None:
        lines.append(_cut(base, WIDTH))
    lines += [
        _cut(
            f"P: the chance its seeds' last-{k} mean at 2x lands within ±{margin:g} of the fit (predictable: ≥ the "
            f"level); Δ: the fits' difference at the budget; m: measured where no fit gives one",
            WIDTH,
        ),
        f"full table, every reason: {_where(out / 'loo_table.md')}",
        f"plot: {_where(out / 'loo_curves.png')}",
    ]
    if ui is None:
        lines.append("MLflow UI: none (fitted from a curves.csv, not from a store)")
    else:
        lines += [f"curves in MLflow's UI: {ui[0]}", ui[1]]
    return "\n".join(lines) + "\n"

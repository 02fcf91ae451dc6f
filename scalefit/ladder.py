"""The margin ladder: where an interval of a difference lies against two edges, written once.

Every call (``scalefit.forecasts.interface``: worse / no difference / better / cannot tell yet), every measured
comparison (``analysis.table``) and the slower-or-lower reading (``scalefit.forecasts.slower_or_lower``: a
ceiling lower / same / higher, an efficiency faster / same / slower) reads an interval this way.
"""

from __future__ import annotations

from typing import Literal

Side = Literal["below", "above", "within"]


def against(lo: float, hi: float, low: float, high: float) -> Side | None:
    """Where ``[lo, hi]`` lies against the edges ``low`` < ``high``: ``below`` (all under ``low``),
    ``above`` (all over ``high``), ``within`` (inside both, edges included), or None (it straddles
    an edge: not resolved)."""
    if hi < low:
        return "below"
    if lo > high:
        return "above"
    if low <= lo and hi <= high:
        return "within"
    return None


def against_margin(lo: float, hi: float, margin: float) -> str | None:
    """Where an interval of a difference (variant - baseline) lies against ±margin: ``worse`` (all
    below -margin), ``better`` (all above +margin), ``within`` (inside it), or None (it straddles an
    edge: not resolved)."""
    side = against(lo, hi, -margin, margin)
    return {"below": "worse", "above": "better"}.get(side, side) if side is not None else None

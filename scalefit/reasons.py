"""Reasons as data: why a forecast is not yet predictable, has no band, or carries no call.

A ``Reason`` is a kind from a fixed vocabulary (``KINDS``), the numbers it is about and the few words
that name what it is about (an arm, a parameter, a knee test's own text), and the reasons it gathers
(``parts``: a curve with no band, for the shape reasons behind it). Its full text (``str(reason)``:
a ``Reason`` is the string a table prints, so every reader of text reads it unchanged) and its short
form (``short()``: the terminal summary's few words) are both rendered here, from that data, in one
place: nothing downstream parses the prose to find what a reason says.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def _value(r: Reason) -> str:
    """A parameter and its value as the fit states them (A to 3 decimals, C_mid to 4 digits, B to 3)."""
    fmt = {"A": ".3f", "C_mid": ".4g", "B": ".3g"}.get(r.words["param"], ".4g")
    return f"{r.words['param']} = {r.numbers['value']:{fmt}}"


def _grid_edge(r: Reason) -> str:
    lo, hi = r.numbers.get("lo"), r.numbers.get("hi")
    fmt = ".3f" if r.words["param"] == "A" else ".4g"
    grid = f" [{lo:{fmt}}, {hi:{fmt}}]" if lo is not None and hi is not None else ""
    why = {
        ("A", True): "asymptote not identified; widen --a-grid",
        ("C_mid", True): "widen --cmid-grid",
        ("A", False): "the asymptote is not identified",
        ("C_mid", False): "not identified",
    }[(r.words["param"], bool(grid))]
    return f"{_value(r)} is on the edge of its grid{grid} ({why})"


def _bound(r: Reason) -> str:
    if "lo" in r.numbers:  # a declared parameter, with its range
        return f"{_value(r)} is on a bound of its range [{r.numbers['lo']:.4g}, {r.numbers['hi']:.4g}]"
    if r.words.get("form") == "range":  # a power law's B
        return f"{_value(r)} is on a bound of its range {r.words['range']}: not a power law"
    if r.words.get("form") == "shape":
        return f"{_value(r)} is on a bound of its range (a {r.words['shape']})"
    return f"{_value(r)} is on a bound of its range: {r.words['shape']}, not a sigmoid"


def _bound_short(r: Reason) -> str:
    if "lo" in r.numbers:
        return f"{_value(r)} on its bound [{r.numbers['lo']:.4g}, {r.numbers['hi']:.4g}]"
    return f"{_value(r)} on its bound"


def _backtests(r: Reason) -> str:
    n, need = int(r.numbers["n"]), int(r.numbers["need"])
    if r.words.get("form") == "campaign":
        return f"{n} backtest(s) past the knee in the campaign (need {need}): its extrapolation is unchecked"
    ratio = r.numbers["ratio"]
    return (
        f"too few points to backtest a {ratio:.2g}x extrapolation ({n} backtest(s) from {int(r.numbers['points'])} "
        f"fitted points; need {need}, each looking at least {ratio**0.5:.2g}x ahead)"
    )


def _backtests_short(r: Reason) -> str:
    if r.words.get("form") == "campaign":
        return f"{int(r.numbers['n'])} backtest(s) past the knee in the campaign"
    return f"too few points to backtest a {r.numbers['ratio']:.2g}x extrapolation"


def _p_within(r: Reason) -> str:
    x = r.numbers
    w, level = int(x["window"]), x["level"]
    what = f"a {int(x['seeds'])}-seed mean" + (f" of the last {w} evaluations" if w > 1 else "")
    text = (
        f"{what} at {x['ratio']:.2g}x lands within ±{x['margin']:g} with probability {x['p']:.2f} "
        f"< {level:g} (its {level:.0%} band is ±{x['half']:.3f}, ±{x['seeds_alone']:.3f} of it the seeds' own noise"
    )
    return text + (": more seeds, not more compute)" if x["seeds_alone"] > x["margin"] else ")")


def _structure(r: Reason) -> str:
    way = "above" if r.numbers["z"] > 0 else "below"
    what = "the latest third of the points" if r.words.get("form") == "points" else "its latest third"
    z = r.numbers["z"]
    return f"{what} lies {way} the fitted curve (z = {z:+.1f}): structure the {r.words['model']} does not explain"


def _structure_short(r: Reason) -> str:
    way = "above" if r.numbers["z"] > 0 else "below"
    what = "the latest third of the points" if r.words.get("form") == "points" else "its latest third"
    return f"{what} lies {way} the fitted curve"


def _arm_no_band(r: Reason) -> str:
    return f"{r.words['arm']} has no band ({r.parts[0]})"


def _arm_no_band_short(r: Reason) -> str:
    short = r.parts[0].short()
    return short if r.words["arm"] == "variant" else f"{r.words['arm']}: {short}"


# kind -> (its full text, its short form), each from the reason's numbers, words and parts
_RENDER: dict[str, tuple[Callable[[Reason], str], Callable[[Reason], str]]] = {
    "knee": (
        lambda r: f"knee not reached: {r.numbers['share']:.0%} of the fitted gain achieved at the last fitted point",
        lambda r: "knee not reached",
    ),
    "open_knee": (
        lambda r: (
            f"its data do not show its knee ({r.words['test']}): at {r.numbers['ratio']:.3g}x its data, "
            f"{r.words['allows']}"
        ),
        lambda r: "its data do not show its knee",
    ),
    "grid_edge": (_grid_edge, lambda r: f"{_value(r)} on its grid edge"),
    "bound": (_bound, _bound_short),
    "backtests": (_backtests, _backtests_short),
    "error": (
        lambda r: (
            f"backtest error {r.numbers['error']:.3f} at {r.numbers['ratio']:.2g}x > margin {r.numbers['margin']}"
        ),
        lambda r: str(r),
    ),
    "p_within": (
        _p_within,
        lambda r: f"{r.numbers['ratio']:.2g}x forecast within ±{r.numbers['margin']:g} with p {r.numbers['p']:.2f}",
    ),
    "structure": (_structure, _structure_short),
    "unlike": (
        lambda r: (
            f"its B {r.numbers['B']:.3g} is unlike the campaign's {r.numbers['campaign_B']:.3g} "
            f"(z = {r.numbers['z']:+.1f}): fitted alone"
        ),
        lambda r: f"its B {r.numbers['B']:.3g} is unlike the campaign's {r.numbers['campaign_B']:.3g}",
    ),
    "collapse": (
        lambda r: (
            f"rises then falls: its mean over {int(r.numbers['window'])} evaluations peaks at "
            f"{r.numbers['peak']:.3f} (compute {r.numbers['peak_compute']:.3g}) and ends at {r.numbers['end']:.3f} "
            f"(z = {r.numbers['z']:.1f})"
        ),
        lambda r: "rises then falls",
    ),
    "no_band": (lambda r: "no band: " + "; ".join(r.parts), lambda r: r.parts[0].short()),
    "arm_no_band": (_arm_no_band, _arm_no_band_short),
    "not_identified": (
        lambda r: f"{r.words['arm']}'s fit is not identified",
        lambda r: f"{r.words['arm']}: fit not identified",
    ),
    "unchecked": (
        lambda r: (
            f"{r.words['arm']}'s extrapolation is unchecked ({int(r.numbers['n'])} backtest(s) past the knee "
            f"in the campaign, need {int(r.numbers['need'])})"
        ),
        lambda r: f"{r.words['arm']}: extrapolation unchecked",
    ),
    "asymptote": (
        lambda r: (
            f"{r.words['arm']}'s asymptote is not bounded (A's interval [{r.numbers['lo']:.3f}, "
            f"{r.numbers['hi']:.3f}] reaches its grid's edge)"
        ),
        lambda r: f"{r.words['arm']}: A's interval reaches its grid",
    ),
    "flat": (
        lambda r: (
            f"no sigmoid gain is identifiable: the curve ends at {r.numbers['end']:.3f} on average, "
            f"R0 = {r.numbers['R0']:.3f} (gain {r.numbers['gain']:+.3f} < {r.numbers['min_gain']}); the curve is flat "
            "or decreasing"
        ),
        lambda r: "flat or falling",
    ),
    "all_bad": (lambda r: "every point is bad", lambda r: "every point is bad"),
    "no_fit": (lambda r: f"no fit: {r.parts[0]}", lambda r: r.parts[0].short()),
    # the forecast of a model size from smaller ones (``scalefit.sizes``)
    "laws_error": (
        lambda r: f"the laws predicted held-out sizes to RMSE {r.numbers['rmse']:.3f} > {r.numbers['tolerance']}",
        lambda r: f"held-out RMSE {r.numbers['rmse']:.3f}",
    ),
    "a_interval": (
        lambda r: (
            f"A's {r.numbers['level']:.0%} interval is ±{r.numbers['half']:.3f} wide (> ±{r.numbers['tolerance']})"
        ),
        lambda r: f"A ±{r.numbers['half']:.3f}",
    ),
    "size_reach": (
        lambda r: f"{r.numbers['reach']:.1f}x the largest fitted size's parameters (> {r.numbers['max']:g}x)",
        lambda r: f"{r.numbers['reach']:.1f}x the largest size",
    ),
    "sizes": (
        lambda r: (
            f"only {int(r.numbers['n'])} fitted sizes: the laws' held-out error rests on {int(r.numbers['n'])} folds"
        ),
        lambda r: f"only {int(r.numbers['n'])} fitted sizes",
    ),
    "stalled": (
        lambda r: (
            f"the ceiling stopped rising with size: {r.words['top']}'s A {r.numbers['top_A']:.3f} is not above "
            f"{r.words['prev']}'s {r.numbers['prev_A']:.3f} by more than their spread (±{r.numbers['spread']:.3f}), "
            f"yet the laws put this size's at {r.numbers['forecast_A']:.3f}"
        ),
        lambda r: "the ceiling stopped rising with size",
    ),
    "sizes_held": (
        lambda r: (
            f"held-out RMSE {r.numbers['rmse']:.3f} <= {r.numbers['tolerance']}, A ±{r.numbers['half']:.3f}, "
            f"{r.numbers['reach']:.1f}x the largest size"
        ),
        lambda r: "predictable",
    ),
}
KINDS = frozenset(_RENDER)


class Reason(str):
    """One reason, as data (``kind``, ``numbers``, ``words``, ``parts``); the string is its full text."""

    kind: str
    numbers: Mapping[str, float]
    words: Mapping[str, str]
    parts: tuple[Reason, ...]

    def __new__(
        cls,
        kind: str,
        numbers: Mapping[str, float] | None = None,
        words: Mapping[str, str] | None = None,
        parts: tuple[Reason, ...] = (),
    ) -> Reason:
        if kind not in KINDS:
            raise ValueError(f"unknown reason kind {kind!r}: one of {sorted(KINDS)}")
        probe = str.__new__(cls, "")
        for name, value in (
            ("kind", kind),
            ("numbers", dict(numbers or {})),
            ("words", dict(words or {})),
            ("parts", tuple(parts)),
        ):
            object.__setattr__(probe, name, value)
        self = str.__new__(cls, _RENDER[kind][0](probe))
        for name in ("kind", "numbers", "words", "parts"):
            object.__setattr__(self, name, getattr(probe, name))
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Reason is frozen")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Reason, (self.kind, dict(self.numbers), dict(self.words), self.parts))

    def short(self) -> str:
        """The reason in a few words (the terminal summary's)."""
        return _RENDER[self.kind][1](self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "numbers": {k: float(v) for k, v in self.numbers.items()},
            "words": dict(self.words),
            "parts": [p.to_dict() for p in self.parts],
            "text": str(self),
        }

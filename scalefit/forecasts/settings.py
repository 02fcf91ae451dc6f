"""A campaign's fit settings (its ``fit:`` section), each with its one default, validated once.

``FitSettings.parse`` takes the section as written (a mapping, or ``None`` for the defaults) and
gives a frozen ``FitSettings``; a ``FitSettings`` passed again is returned as it is, so a campaign
parsed when it loads is never parsed again. Each wrong value is one ``FitError`` line naming the
key and the fix. Its margin and level default to the library's (``scalefit.defaults``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from typing import Any

import numpy as np

from scalefit.defaults import DEFAULT_LEVEL, DEFAULT_MARGIN
from scalefit.errors import FitError
from scalefit.models.grids import parse_grid
from scalefit.models.registry import registered

POOLING = ("partial", "none")  # fit.pooling: the variants fitted jointly, or each on its own


@dataclass(frozen=True)
class FitSettings:
    """How a campaign's curves are fitted and judged."""

    model: str = "sigmoid"  # the curve fitted to each variant: sigmoid (ScaleRL) or power_law (the paper's comparison)
    x: str = "compute/samples"  # the compute axis: completions generated (wall-clock would also measure machine load)
    exclude_below: float | None = None  # fit only points at or above this compute
    a_grid: str = "0.05:1.0:0.005"  # LO:HI:STEP of the grid over the asymptote A
    margin: float = DEFAULT_MARGIN
    level: float = DEFAULT_LEVEL
    eval_prompts: int | None = None  # prompts per evaluation: floors the noise estimate at mean@16's binomial variance
    pooling: str = "partial"  # partial: the variants fitted jointly (B partially pooled, R0 shared); none: one by one
    last_k: int = 3  # targets also scored as the mean of each run's last k evaluations (less noisy than the last one)

    @classmethod
    def parse(
        cls, fit: Mapping[str, Any] | FitSettings | None, x_choices: tuple[str, ...] | None = None
    ) -> FitSettings:
        """The section over the defaults, checked: one ``FitError`` line naming the key and the fix.
        ``x_choices``: the compute axes the runs log (the caller knows them)."""
        if isinstance(fit, FitSettings):
            return fit
        fit = dict(fit or {})
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(fit) - set(names), key=str)
        if unknown:
            near = difflib.get_close_matches(str(unknown[0]), names, n=1)
            hint = f"; did you mean 'fit.{near[0]}'?" if near else f"; known keys: {', '.join(names)}"
            raise FitError(f"unknown key 'fit.{unknown[0]}' in the campaign's fit section{hint}")
        s = cls(**fit)

        def number(v: Any) -> bool:
            return isinstance(v, int | float) and not isinstance(v, bool)

        if x_choices is not None and s.x not in x_choices:
            raise FitError(f"fit.x = {s.x!r}: not a compute axis runs log; one of {', '.join(x_choices)}")
        if not isinstance(s.a_grid, str):
            raise FitError(f"fit.a_grid = {s.a_grid!r}: expected a string LO:HI:STEP, e.g. '0.05:1.0:0.005'")
        parse_grid(s.a_grid, name="fit.a_grid", kind="step")
        if not number(s.level) or not 0 < s.level < 1:
            raise FitError(f"fit.level = {s.level!r}: expected a coverage in (0, 1), e.g. 0.9")
        if not number(s.margin) or not 0 < s.margin < 1:
            raise FitError(
                f"fit.margin = {s.margin!r}: expected a difference in pass rate in (0, 1), e.g. 0.02 (the run-to-run"
                " spread of A); within it two variants are called the same, and with 0 none ever would be"
            )
        v = s.eval_prompts
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise FitError(f"fit.eval_prompts = {v!r}: expected a whole number of prompts >= 1, e.g. 64")
        if s.exclude_below is not None and (not number(s.exclude_below) or s.exclude_below < 0):
            raise FitError(f"fit.exclude_below = {s.exclude_below!r}: expected a compute >= 0")
        models = registered()
        if s.model not in models:
            raise FitError(
                f"fit.model = {s.model!r}: expected sigmoid (the ScaleRL curve, the default) or power_law"
                f" (the paper's comparison form); registered: {', '.join(models)}"
            )
        if s.pooling not in POOLING:
            raise FitError(
                f"fit.pooling = {s.pooling!r}: expected partial (the variants fitted jointly, the default) or none"
                " (each variant on its own)"
            )
        if not models[s.model].pools and s.pooling == "partial":
            raise FitError(
                f"fit.model = {s.model} with fit.pooling = partial: the joint fit pools the sigmoid's B only;"
                " set fit.pooling: none"
            )
        if isinstance(s.last_k, bool) or not isinstance(s.last_k, int) or s.last_k < 1:
            raise FitError(f"fit.last_k = {s.last_k!r}: expected a whole number of evaluations >= 1, e.g. 3")
        return s

    @cached_property
    def a_values(self) -> np.ndarray:
        """The A grid's values."""
        return parse_grid(self.a_grid, name="fit.a_grid", kind="step")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

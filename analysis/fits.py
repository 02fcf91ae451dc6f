"""Fit a campaign's curves, the second part of ``analysis fit``: every variant on a share of its
compute, jointly or one at a time as the campaign's one ``FitSettings`` says (``campaign_model``)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.curves import bad_points, spliced, steady_points
from runners.contract import MEAN_AT_16
from scalefit.forecasts.interface import CampaignForecast
from scalefit.forecasts.pooled import forecast_variants
from scalefit.forecasts.settings import FitSettings
from scalefit.reasons import Reason

WALL_CLOCK = "compute/gpu_hours"


def no_fit(why: str) -> str:
    """A variant's note where it has no fit: the reason as data where the fit gave one."""
    return Reason("no_fit", parts=(why,)) if isinstance(why, Reason) else f"no fit: {why}"


def warn_wall_clock(settings: FitSettings) -> None:
    """Warn when the campaign fits wall-clock time: on a loaded machine it measures the load too."""
    if settings.x == WALL_CLOCK:
        warnings.warn(
            f"fit.x = {WALL_CLOCK} is wall-clock time: on a shared or loaded machine it measures the load as well "
            "as the recipe (identical learning curves can fit different B); compute/samples or compute/tokens do not",
            stacklevel=3,
        )


HALF_RESAMPLES = 400  # the fit on half of each variant's compute: its calls and the extrapolation check


MIN_FIT_POINTS = 4  # scalefit fits a sigmoid to at least this many points with compute above zero


def fit_share(g: pd.DataFrame, x: str, frac: float = 0.5, exclude_below: float | None = None) -> float | None:
    """The share of a variant's compute to fit on for an extrapolation check: ``frac`` (the paper's
    half), or more when that holds fewer than the ``MIN_FIT_POINTS`` a fit needs (seeds pooled, as
    the fit pools them); None when no share leaves an evaluation after them to predict."""
    end = float(g[x].max())
    xs = np.sort(g[x].to_numpy(float))
    xs = xs[(xs > 0) & (xs >= (exclude_below or 0))]
    if end <= 0 or len(xs) < MIN_FIT_POINTS or xs[MIN_FIT_POINTS - 1] >= end:
        return None
    return max(frac, float(xs[MIN_FIT_POINTS - 1]) / end)


@dataclass
class Model(CampaignForecast):
    """A campaign's fits and forecasts at one fraction of each variant's budget (``CampaignForecast``,
    jointly or one variant at a time as ``fit.pooling`` says), with each variant's budget."""

    budgets: dict[str, float] = field(default_factory=dict)  # each variant's last compute
    fit_upto: dict[str, float] = field(default_factory=dict)  # fitted on compute up to this (fraction < 1);
    # a variant missing here (fraction < 1) has no share of its compute that holds a fit and a point after it


def campaign_model(curves: pd.DataFrame, settings: FitSettings, n_boot: int = 1000, fraction: float = 1.0) -> Model:
    """Fit every variant on the first ``fraction`` of its compute (1: all of it) and forecast it
    (to its budget when ``fraction`` < 1, else to 2x it). Spliced variants are never fitted."""
    x = settings.x
    curves = steady_points(bad_points(curves, x)[0])[0]
    groups = dict(tuple(curves.groupby("variant", sort=False)))
    budgets = {v: float(g[x].max()) for v, g in groups.items()}
    failed = {v: f"no fit: {why}" for v, g in groups.items() if (why := spliced(g, x))}
    upto: dict[str, float] | None = None
    if fraction < 1:  # the first `fraction`, or the smallest share that holds a fit (fit_share)
        shares = {v: fit_share(g, x, fraction, settings.exclude_below) for v, g in groups.items()}
        upto = {v: share * budgets[v] for v, share in shares.items() if share is not None}
        for v in set(groups) - set(upto) - set(failed):
            failed[v] = (
                f"no check: {int((groups[v][x] > 0).sum())} evaluation(s) with {x} > 0; a fit needs "
                f"{MIN_FIT_POINTS}, and a later one to predict"
            )
    data = {
        v: (g[x].to_numpy(), g[MEAN_AT_16].to_numpy(), g["seed"].to_numpy())
        for v, g in groups.items()
        if v not in failed
    }
    target = budgets if fraction < 1 else None
    res = forecast_variants(data, settings, fit_upto=upto, target=target, n_resamples=n_boot)
    failed.update({v: no_fit(why) for v, why in res.failed.items()})
    order = [v for v in groups if v in res.fits]
    fits, fcs = {v: res.fits[v] for v in order}, {v: res.forecasts[v] for v in order}
    return Model(fits, fcs, failed, res.description, budgets, upto or {})

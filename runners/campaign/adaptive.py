"""Adaptive campaigns: at decision points (fractions of the budget) fit the campaign on what it
has run so far, and stop the variants the scaling law already rules out.

A campaign's ``adaptive: {at: [0.25, 0.5], margin: 0.02, risk: 0.05}`` turns it on. At each
point, a variant is decided once every run of it and of the baseline has reached that point.
The fit follows the campaign's ``fit.pooling``:

- ``partial`` (the default, as ``analysis fit``): the joint model of ``scalefit.forecasts.pooled_fit`` /
  ``scalefit.forecasts.pooled`` over every variant (baseline included) whose runs have all reached
  the point, each on its points up to that fraction of its own budget and forecast to its full
  budget (B partially pooled, R0 shared, seeds the unit of uncertainty). The variants decided at
  one point with the same variants reached share one joint fit. A variant the joint fit leaves
  out (it cannot be fitted) goes to the no-gain rule below; one whose curve gets no band (not a
  sigmoid) keeps running.
- ``none``: the variant and the baseline each fitted alone (seeds pooled).

``scalefit.decide_stop`` then stops the variant when its final value is unlikely (< risk) to reach
the baseline's minus the margin and both forecasts are predictable; every decision records which
fit took it (``StopDecision.fit_model``). The same ``decide_at`` serves the live campaign (curves
read from MLflow) and the offline replay of recorded curves (``tests/bench_adaptive.py``).

A stop is a file ``STOP`` in the run's folder: the run sees it at its next step, saves a
checkpoint and ends; its MLflow run keeps its history and carries the decision as tags.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from mlflow.tracking import MlflowClient
from scipy.stats import norm

from runners.campaign.spec import Adaptive, X
from runners.contract import MEAN_AT_16, STOP_FILE
from runners.tracking import store
from scalefit import FitError, StopDecision, decide_stop, fit_and_forecast
from scalefit.decide.stop import error_name
from scalefit.forecasts.pooled import fit_and_forecast_campaign
from scalefit.forecasts.settings import FitSettings

PER_VARIANT = "pooling none: each variant fitted on its own"  # as the LOO table's fit_model column says


def upto(curves: pd.DataFrame, name: str, fraction: float, budget: float) -> pd.DataFrame:
    """A variant's points up to ``fraction`` of its budget: all a decision there may see."""
    return curves[(curves["variant"] == name) & (curves[X] <= fraction * budget * (1 + 1e-9))]


def reached(curves: pd.DataFrame, name: str, fraction: float, budget: float, n_runs: int | None = None) -> bool:
    """Whether every run of the variant (``n_runs``; default: every seed in ``curves``) has an
    evaluation at or past ``fraction`` of its budget."""
    g = curves[curves["variant"] == name]
    n = g["seed"].nunique() if n_runs is None else n_runs
    return n > 0 and g[g[X] >= fraction * budget * (1 - 1e-9)]["seed"].nunique() == n


def decision_settings(cfg: Adaptive) -> FitSettings:
    """The fit settings a decision fits with: the campaign's ``fit:`` section as ``Adaptive`` carries
    it (parsed when the campaign loaded), with the adaptive margin; every point kept (no ``exclude_below``)."""
    return FitSettings(
        model=cfg.model,
        a_grid=cfg.a_grid,
        margin=cfg.margin,
        level=cfg.level,
        eval_prompts=cfg.eval_prompts,
        pooling=cfg.pooling,
        last_k=cfg.last_k,
    )


def forecast_at(curves: pd.DataFrame, name: str, fraction: float, budget: float, cfg: Adaptive):
    """A variant's forecast (fitted alone) to its budget from its points up to ``fraction`` of it;
    raises ``FitError`` when they cannot be fitted yet."""
    g = upto(curves, name, fraction, budget)
    settings = decision_settings(cfg)
    _, fc = fit_and_forecast(g[X], g[MEAN_AT_16], settings, runs=g["seed"], target=budget, n_resamples=cfg.n_resamples)
    return fc


def joint_at(curves: pd.DataFrame, variants: Iterable[str], fraction: float, budgets: dict[str, float], cfg: Adaptive):
    """The campaign's joint model at ``fraction``: ``variants`` fitted together, each on its points up
    to that fraction of its own budget, forecast to its full budget. Returns (CampaignFit, forecasts)."""
    order = sorted(variants, key=lambda v: (v != "baseline", v))
    data = {}
    for v in order:
        g = upto(curves, v, fraction, budgets[v])
        data[v] = (g[X].to_numpy(float), g[MEAN_AT_16].to_numpy(float), g["seed"].to_numpy())
    return fit_and_forecast_campaign(
        data,
        decision_settings(cfg),
        fit_upto={v: fraction * budgets[v] for v in order},
        target={v: budgets[v] for v in order},
        n_resamples=cfg.n_resamples,
    )


def decide_at(
    curves: pd.DataFrame,
    variant: str,
    fraction: float,
    budgets: dict[str, float],
    cfg: Adaptive,
    cache: dict[Any, Any] | None = None,
    included: Iterable[str] | None = None,
) -> StopDecision:
    """The decision for ``variant`` at ``fraction`` of the budget, from points up to that fraction only.

    curves: one row per evaluation with ``variant``, ``seed``, ``compute/samples`` and
    ``val/mean_at_16`` (as ``analysis`` writes ``curves.csv``); budgets: each variant's full
    budget in completions. cache: the fits shared by the variants decided at the same point (the
    joint model by fraction and variants included, or the baseline's own forecast by fraction;
    a ``FitError`` where it failed): once every run of a variant has passed a point, its points up
    to it no longer change. included (``fit.pooling: partial``): the variants whose runs have all
    reached the point (default: those of ``curves`` whose every seed has); the variant and the
    baseline always are.

    Two ways to stop: the fitted rule (``scalefit.decide_stop``), and **no gain**: a variant that
    has not risen above its start (so no sigmoid can be fitted, and none ruled out) while the
    baseline has already made most of its predicted gain and is predicted to end above anything
    the variant has reached, by more than the margin. The baseline must be predictable, or
    identified with only its backtest error (joint model: the expected error of its k-seed
    prediction) above the margin: then its prediction is first lowered by z(risk) x that error, as
    the fitted rule does.
    """
    cache = {} if cache is None else cache
    if cfg.pooling == "none":
        d = _decide_alone(curves, variant, fraction, budgets, cfg, cache)
        d.fit_model = PER_VARIANT
        return d
    if included is None:
        included = [v for v in budgets if v in set(curves["variant"]) and reached(curves, v, fraction, budgets[v])]
    members = frozenset({*included, variant, "baseline"})
    key = ("joint", fraction, members)
    if key not in cache:
        try:
            cache[key] = joint_at(curves, members, fraction, budgets, cfg)
        except FitError as e:
            cache[key] = e
    model = cache[key]
    if isinstance(model, FitError):
        return StopDecision(False, f"keep running: the campaign's joint fit failed ({model})", fit_model="joint")
    cfit, fcs = model
    described = cfit.describe()
    if "baseline" not in fcs:
        why = cfit.failed.get("baseline", "not fitted")
        return StopDecision(False, f"keep running: the baseline cannot be fitted yet ({why})", fit_model=described)
    base = fcs["baseline"]
    if variant not in fcs:
        g = upto(curves, variant, fraction, budgets[variant])
        d = _no_gain(g, base, fraction, budgets["baseline"], cfg, cfit.failed.get(variant, "not fitted"))
    else:
        d = decide_stop(fcs[variant], base, budgets[variant], budgets["baseline"], margin=cfg.margin, risk=cfg.risk)
    d.fit_model = described
    return d


def _decide_alone(
    curves: pd.DataFrame, variant: str, fraction: float, budgets: dict[str, float], cfg: Adaptive, cache: dict
) -> StopDecision:
    """``fit.pooling: none``: the variant and the baseline each fitted alone."""
    key = ("baseline", fraction)
    if key not in cache:
        try:
            cache[key] = forecast_at(curves, "baseline", fraction, budgets["baseline"], cfg)
        except FitError as e:
            cache[key] = e
    base = cache[key]
    if isinstance(base, FitError):
        return StopDecision(False, f"keep running: the baseline cannot be fitted yet ({base})")
    try:
        fc = forecast_at(curves, variant, fraction, budgets[variant], cfg)
    except FitError as e:
        return _no_gain(
            upto(curves, variant, fraction, budgets[variant]), base, fraction, budgets["baseline"], cfg, str(e)
        )
    return decide_stop(fc, base, budgets[variant], budgets["baseline"], margin=cfg.margin, risk=cfg.risk)


NO_GAIN = 0.01  # below this rise over its start a curve has shown no gain (scalefit's own threshold)
BASELINE_GAIN_SHARE = 0.5  # the baseline must have made at least this share of its predicted gain


def _no_gain(g: pd.DataFrame, baseline, fraction: float, budget: float, cfg: Adaptive, why: str) -> StopDecision:
    """The variant could not be fitted: stop it only if it shows no gain at all while the
    (predictable) baseline has made most of its own and will end clearly above the variant."""
    by_seed = g.sort_values(X).groupby("seed")[MEAN_AT_16]
    start = float(by_seed.first().mean())
    latest = float(by_seed.apply(lambda v: v.tail(3).mean()).mean())  # the last three evaluations, seeds averaged
    best = float(by_seed.max().max())
    f = baseline.fit
    b_final = float(baseline.point([budget])[0])
    b_now = float(baseline.point([fraction * budget])[0])
    c_in, v_in = f.inputs  # its level before training: the fit's (R0) where the model has one, else measured
    r0 = f.start_level if f.start_level is not None else float(v_in[c_in == c_in.min()].mean())
    share = (b_now - r0) / (b_final - r0) if b_final != r0 else 0.0
    lo = float(np.percentile(baseline.mean_draws([budget])[:, 0], 100 * cfg.risk))
    verdict = baseline.verdict
    if verdict is not None and not verdict.predictable and verdict.error_only:
        # identified, its only flaw a backtest (joint: expected) error above the margin: as decide_stop does,
        # move its prediction down by z(risk) x that error before comparing
        lo -= float(norm.ppf(1.0 - cfg.risk)) * (baseline.expected_error or 0.0)
    base = StopDecision(False, "", variant_final=latest, baseline_final=b_final)
    if latest - start >= NO_GAIN:
        base.reason = f"keep running: the variant cannot be fitted yet ({why})"
    elif verdict is None or not (verdict.predictable or verdict.error_only):
        base.reason = f"keep running: the variant shows no gain, but the baseline is not yet predictable ({why})"
    elif share < BASELINE_GAIN_SHARE or lo - cfg.margin <= best:
        base.reason = (
            f"keep running: the variant shows no gain yet, the baseline has made {share:.0%} of its gain "
            f"and ends at least {lo:.3f} (variant's best {best:.3f})"
        )
    else:
        base.stop = True
        base.reason = (
            f"stop: no gain (mean@16 {start:.3f} -> {latest:.3f}) at {fraction:.0%} of the budget, while the baseline "
            f"has made {share:.0%} of its gain and ends above {lo:.3f} with probability {1 - cfg.risk:.0%}"
            f"{'' if verdict.predictable else f' after its {error_name(baseline)}'} "
            f"(variant's best {best:.3f}, margin {cfg.margin:g})"
        )
    return base


def decision_tag(fraction: float) -> str:
    return f"{store.DECISION_PREFIX}{round(fraction * 100):d}"


@dataclass
class Monitor:
    """Watches a live campaign's runs and acts on its decision points (called by the scheduler)."""

    cfg: Adaptive
    client: MlflowClient
    runs: dict[str, list[tuple[str, Path, float]]]  # variant -> [(MLflow run id, run folder, budget)]
    log: Callable[[str], None] = print
    every: float = 10.0
    exempt: set[str] = field(default_factory=set)  # variants resumed past a stop (--resume-stopped)
    decided: dict[tuple[str, float], StopDecision] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)
    _fits: dict[Any, Any] = field(default_factory=dict)  # decide_at's cache: the fits at each point
    _last: float = 0.0

    def __post_init__(self) -> None:
        """Decisions a killed campaign already took stand, for every run of the variant: a kill
        between tagging one seed's run and the next leaves the decision on some of them only."""
        for variant, members in self.runs.items():
            if variant in self.exempt or variant == "baseline":
                continue
            tags = [self.client.get_run(run_id).data.tags for run_id, _, _ in members]
            for f in self.cfg.at:
                recorded = next((t[decision_tag(f)] for t in tags if decision_tag(f) in t), None)
                if recorded is not None:
                    d = json.loads(recorded)
                    self._apply(variant, f, StopDecision(**{**d, "stop": bool(d["stop"])}))

    def _apply(self, variant: str, f: float, d: StopDecision) -> None:
        """Record a decision on every run of the variant; a stop also writes their STOP files."""
        self.decided[(variant, f)] = d
        record = json.dumps(d.to_dict())[:5000]
        for run_id, run_dir, _ in self.runs[variant]:
            self.client.set_tag(run_id, decision_tag(f), record)
            if d.stop:
                self.client.set_tag(run_id, store.STOP_DECISION, f"at {f:.0%}: {d.reason}"[:5000])
                _write_stop(run_dir, {**d.to_dict(), "fraction": f})
        if d.stop:
            self.stopped.add(variant)

    def _pending(self) -> list[tuple[float, str]]:
        return [
            (f, v)
            for f in self.cfg.at
            for v in self.runs
            if v not in ("baseline", *self.exempt) and v not in self.stopped and (v, f) not in self.decided
        ]

    def __call__(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._last < self.every:
            return
        self._last = time.monotonic()
        if "baseline" not in self.runs or not self._pending():  # nothing left to decide: read nothing
            return
        curves = self._curves()
        budgets = {v: members[0][2] for v, members in self.runs.items()}
        for f, variant in self._pending():
            if variant in self.stopped:  # stopped at an earlier point in this same pass
                continue
            if not all(self._reached(curves, v, f, budgets[v]) for v in (variant, "baseline")):
                continue
            included = [v for v in self.runs if self._reached(curves, v, f, budgets[v])]
            d = decide_at(curves, variant, f, budgets, self.cfg, self._fits, included)
            self.log(f"adaptive: {variant} at {f:.0%} of its budget: {d.reason}")
            self._apply(variant, f, d)

    def _curves(self) -> pd.DataFrame:
        rows = []
        for variant, members in self.runs.items():
            for seed, (run_id, _, _) in enumerate(members):
                y = store.history(self.client, run_id, MEAN_AT_16)
                x = store.history(self.client, run_id, X)
                both = pd.concat([x, y], axis=1, keys=[X, MEAN_AT_16]).dropna()
                rows += [
                    {"variant": variant, "seed": seed, "step": int(s), X: r[X], MEAN_AT_16: r[MEAN_AT_16]}
                    for s, r in both.iterrows()
                ]
        return pd.DataFrame(rows, columns=["variant", "seed", "step", X, MEAN_AT_16])

    def _reached(self, curves: pd.DataFrame, variant: str, fraction: float, budget: float) -> bool:
        return reached(curves, variant, fraction, budget, len(self.runs[variant]))

    def saved(self) -> dict[str, float]:
        """Compute not spent on stopped runs: completions and (estimated) device-hours, and shares."""
        planned = sum(b for members in self.runs.values() for _, _, b in members)
        saved_samples = saved_hours = 0.0
        for variant in self.stopped:
            for run_id, _, budget in self.runs[variant]:
                samples = store.history(self.client, run_id, X)
                hours = store.history(self.client, run_id, "compute/gpu_hours")
                done = float(samples.iloc[-1]) if len(samples) else 0.0
                saved_samples += max(budget - done, 0.0)
                if done > 0 and len(hours):
                    saved_hours += float(hours.iloc[-1]) / done * max(budget - done, 0.0)
        return {
            "samples_saved": saved_samples,
            "share_saved": saved_samples / planned if planned else 0.0,
            "device_hours_saved": saved_hours,
        }


def _write_stop(run_dir: Path, decision: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f"{STOP_FILE}.tmp"
    tmp.write_text(json.dumps(decision, default=float))
    tmp.replace(run_dir / STOP_FILE)

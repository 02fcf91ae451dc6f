"""From a campaign in MLflow to the paper's LOO table: curves, fits, verdicts, plots.

The campaign's fit settings arrive parsed (a ``FitSettings``, parsed once where the campaign loads)
and go down whole: every function here reads the one object it is given.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from mlflow.tracking import MlflowClient

from analysis import evidence
from analysis.planner import plan as seed_plan
from runners.contract import COMPUTE_METRICS, MEAN_AT_16, PASS_AT_16
from runners.ops import store
from scalefit import FitError, compare_fits, seed_spread
from scalefit.models import make_model
from scalefit.plot import plot_fits
from scalefit.pooled_forecast import forecast_variants
from scalefit.prediction import CampaignForecast, Forecast, against_margin, call_difference
from scalefit.settings import FitSettings
from scalefit.unstable import Flag, arm_counts, flag_runs

CURVE_METRICS = (MEAN_AT_16, PASS_AT_16, *COMPUTE_METRICS)
WALL_CLOCK = "compute/gpu_hours"


def load_curves(
    campaign: str, tracking_uri: str | None = None, current: set[str] | None = None, log=print
) -> pd.DataFrame:
    """Every validation point of every run of a campaign (full metric history, not the last value).

    ``current``: the run identities the campaign file expands to now. When the store holds some of
    them, runs of other versions of the campaign (an edited recipe, budget or seeds; other code)
    are left out and counted, never pooled with these; a store with none of them (a study
    recorded by older code) is read whole.
    """
    client = store.read_client(tracking_uri)
    exp_id = store.experiment_id(client, campaign)
    if exp_id is None:
        raise ValueError(f"no MLflow experiment named {campaign!r} at {client.tracking_uri}; run the campaign first")
    runs = store.identified_runs(client, exp_id)
    if current and current & set(runs):
        others = set(runs) - current
        if others:
            log(
                f"{len(others)} run(s) of another version of campaign {campaign} (another recipe, budget, seeds or"
                " code) left out of the fit; they stay in MLflow"
            )
        runs = {k: r for k, r in runs.items() if k in current}
    frames = []
    for run in runs.values():
        cols = {key: store.history(client, run.info.run_id, key) for key in CURVE_METRICS}
        df = pd.DataFrame(cols).rename_axis("step").reset_index()
        if df["compute/samples"].isna().all():  # runs logged before compute/samples existed
            df["compute/samples"] = _samples_by_step(df["step"], run.data.params)
        if df.empty:
            continue
        tags = run.data.tags
        df.insert(0, "run", run.info.run_name)
        df.insert(1, "variant", tags.get(store.VARIANT, ""))
        df.insert(2, "axis", tags.get(store.AXIS, ""))
        df.insert(3, "seed", int(tags.get(store.SEED, 0)))
        df["run_id"] = run.info.run_id
        df["done"] = store.is_done(run)
        df["stopped"] = tags.get(store.STOP_DECISION, "") if store.is_stopped(run) else ""
        frames.append(df[df["step"].isin(cols[MEAN_AT_16].index)])  # a logged NaN stays, to be named (bad_points)
    if not frames:
        raise ValueError(f"campaign {campaign!r} has no validation curves yet")
    cols = ["run", "variant", "axis", "seed", "step", *CURVE_METRICS, "run_id", "done", "stopped"]
    curves = pd.concat(frames, ignore_index=True)[cols].sort_values(["variant", "seed", "step"], ignore_index=True)
    _one_run_per_seed(curves, f"campaign {campaign!r} at {client.tracking_uri}", "run_id")
    return curves


def _one_run_per_seed(curves: pd.DataFrame, source: str, run_col: str = "run") -> None:
    """Refuse curves where two runs share a variant and seed number: pooled, the bootstrap would
    resample them as one series (two studies joined, or two versions of one campaign)."""
    runs = curves.groupby(["variant", "seed"])[run_col].unique()
    shared = runs[runs.map(len) > 1]
    if len(shared):
        (variant, seed), ids = shared.index[0], shared.iloc[0]
        names = curves.loc[curves[run_col].isin(ids), "run"].unique()
        raise ValueError(
            f"{source}: {len(ids)} runs ({', '.join(map(str, names))}) are all {variant!r} seed {seed}: runs of"
            " different studies or campaign versions need distinct seed numbers, or fit one version (the"
            " campaign file as it is now picks its own runs)"
        )


def read_curves(path: Path, settings: FitSettings) -> pd.DataFrame:
    """A published ``curves.csv`` (what ``load_curves`` returned, saved), checked for the columns the
    campaign's fit ``settings`` need; empty text cells read back as "" as they were written, not NaN."""
    x = settings.x
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        curves = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path}: an empty file; a curves.csv has a header and a row per evaluation") from None
    missing = [c for c in ("run", "variant", "axis", "seed", "step", MEAN_AT_16, x) if c not in curves]
    if missing:
        raise ValueError(
            f"{path}: missing column(s) {', '.join(map(repr, missing))} (a curves.csv as `analysis fit` writes it has"
            f" {', '.join(['run', 'variant', 'axis', 'seed', 'step', *CURVE_METRICS])})"
        )
    if curves.empty:
        raise ValueError(
            f"{path}: a header and no rows: no evaluation to fit; write it again from the campaign's store "
            "(`python -m analysis fit CAMPAIGN` writes artifacts/campaigns/CAMPAIGN/fit/curves.csv)"
        )
    run_col = "run_id" if "run_id" in curves else "run"  # names repeat across versions of a campaign; ids do not
    rep = curves[curves.duplicated([run_col, "step"])]
    if len(rep):
        raise ValueError(
            f"{path}: run {rep['run'].iloc[0]!r} has step {rep['step'].iloc[0]} more than once (a file joined twice?)"
        )
    _one_run_per_seed(curves, str(path), run_col)
    text = [c for c in ("axis", "stopped") if c in curves]
    return curves.astype({c: object for c in text}).fillna({c: "" for c in text})


def _samples_by_step(steps: pd.Series, params: dict[str, str]) -> pd.Series:
    """Completions generated before each step, from a run's logged recipe: one batch of rollouts per
    step, or (PPO-off-policy-k) one per k steps."""
    rollouts = int(params.get("batch.prompts", 0)) * int(params.get("batch.generations", 0))
    k = int(params.get("algorithm.off_policy_k", 1)) if params.get("algorithm.off_policy") == "ppo" else 1
    return np.ceil(steps / k) * rollouts


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
    failed = {v: f"no fit: {why}" for v, g in groups.items() if (why := _spliced(g, x))}
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
    failed.update({v: f"no fit: {why}" for v, why in res.failed.items()})
    order = [v for v in groups if v in res.fits]
    fits, fcs = {v: res.fits[v] for v in order}, {v: res.forecasts[v] for v in order}
    return Model(fits, fcs, failed, res.description, budgets, upto or {})


def fit_table(
    curves: pd.DataFrame, settings: FitSettings, n_boot: int = 1000, half: Model | None = None
) -> tuple[pd.DataFrame, dict]:
    """Fit the campaign (jointly unless ``fit.pooling: none``), forecast each variant, and compare it
    with the baseline by the paper's rule; call each variant against the baseline at the budget from
    the fit to all of it and from the fit to its first half (``half``, fitted here when not given,
    with ``HALF_RESAMPLES`` resamples or ``n_boot`` where that is fewer).

    Intervals come from the seed bootstrap (seeds the unit of run-to-run variation); a variant that
    is not yet predictable, whose fit sits on a grid edge or that is not a sigmoid gets "cannot
    decide", never a winner.
    """
    warn_wall_clock(settings)
    x, y = settings.x, MEAN_AT_16
    curves, dropped = bad_points(curves, x)  # each named in its variant's note; the other points are fitted
    if curves.empty:
        raise ValueError(f"no evaluation to fit: every point is bad ({dropped['why'].iloc[0]}, ...)")
    model = campaign_model(curves, settings, n_boot)
    fits, fcs = model.fits, model.forecasts
    flags = steady_points(curves)[1]
    counts = arm_counts(curves, flags)
    rows = []
    for variant, g in curves.groupby("variant", sort=False):
        row: dict[str, Any] = {
            "variant": variant,
            "axis": g["axis"].iloc[0] or "—",
            "seeds": g["seed"].nunique(),
            "points": len(g),
            "final_mean_at_16": g.sort_values(x).groupby("seed")[y].last().mean(),
            f"final_last{settings.last_k}_mean_at_16": g.sort_values(x).groupby("seed").tail(settings.last_k)[y].mean(),
            "unfinished": _unfinished(g),
            "fit_model": model.description,
        }
        if variant in counts:  # collapses: reported, left out of the fit and the seed noise, kept in the curves
            mine = [f.text() for f in flags if f.variant == variant]
            row.update(unstable_runs=len(mine), unstable=f"{counts[variant]}: {'; '.join(mine)}")
        stops = sorted(set(g["stopped"].fillna(""))) if "stopped" in g else []
        if any(stops):  # an adaptive campaign stopped it: its final value is the decision's prediction
            row["stopped"] = "stopped early " + "; ".join(x for x in stops if x)
        if variant not in fits:
            rows.append({**row, "note": model.failed.get(variant, "no fit")})
            continue
        f, fc = fits[variant], fcs[variant]
        row["model"] = f.name
        row.update(f.params)  # the model's own parameters: A, B, C_mid (sigmoid); A, D, B (power law)
        if f.has_asymptote:
            row["A_lo"], row["A_hi"] = fc.interval("A")
        row.update(
            R0=getattr(f, "R0", np.nan),
            sse=f.sse,
            a_at_edge=getattr(f, "a_at_edge", False),
            b_at_bound=getattr(f, "b_at_bound", False) or any(r.startswith("B =") for r in f.not_identified),
            pooled=_pooled_label(f),
            predictable=fc.verdict.predictable,
            predictability=fc.verdict.text(),
            expected_error=fc.expected_error,
            note="; ".join(filter(None, [*f.warnings, getattr(f, "pool_note", "")])),
        )
        if g["seed"].nunique() > 1 and f.name == "sigmoid":  # the paper's run-to-run spread of A
            try:
                per_seed = {s: (gs[x], gs[y]) for s, gs in g.groupby("seed")}
                spread = seed_spread(per_seed, exclude_below=settings.exclude_below, a_grid=settings.a_values).to_dict()
                row["A_seed_half_range"] = spread["A_half_range"]
            except FitError as e:  # the pooled fit stands; one seed alone (e.g. a flat one) has no sigmoid
                row["note"] = "; ".join(filter(None, [row["note"], f"no per-seed A spread: {e}"]))
        rows.append(row)
    table = pd.DataFrame(_note_dropped(rows, dropped))
    if "baseline" in fits:
        verdicts, b_shared = [], []
        for v in table["variant"]:
            if v == "baseline" or v not in fits:
                verdicts.append("baseline" if v == "baseline" else "")
                b_shared.append(np.nan)
                continue
            c = compare_fits(
                fits["baseline"],
                fits[v],
                margin=settings.margin,
                names=("baseline", v),
                forecasts=(fcs["baseline"], fcs[v]),
            )
            verdicts.append(_short_verdict(c, fcs["baseline"], fcs[v]))
            b_shared.append(c.B_candidate if c.rule == "B" else np.nan)
        table["verdict"] = verdicts
        table["B_at_shared_A"] = b_shared
    if half is None:  # never more resamples than the fit to all of it
        half = campaign_model(curves, settings, min(n_boot, HALF_RESAMPLES), fraction=0.5)
    table = table.merge(_calls(model, half, settings.margin), on="variant", how="left")
    measured = measured_at_budget(curves, x, settings.margin, last_k=settings.last_k)
    if len(measured):
        table = table.merge(measured, on="variant", how="left")
        half_m = measured_at_budget(curves, x, settings.margin, fraction=0.5, last_k=settings.last_k)
        half_m = half_m.rename(columns=lambda c: c if c == "variant" else f"half_{c}")  # where efficiency shows
        table = table.merge(half_m, on="variant", how="left")
    table = table.merge(_resolvable(curves, x, settings), on="variant", how="left")
    table = _flag_identical_curves(curves, table, x)
    return table, {"fits": fits, "forecasts": fcs, "model": model, "half": half}


def _pooled_label(f: Any) -> str:
    """How a variant's B was fitted: pooled with the campaign's, alone (and why), or on its own."""
    prior = getattr(f, "prior", None)
    if prior is not None:
        return f"pooled (campaign B {prior.B:.2f})"
    note = getattr(f, "pool_note", "")
    return f"alone: {note}" if note else "alone"


def _calls(model: Model, half: Model, margin: float) -> pd.DataFrame:
    """Each variant against the baseline at the budget both reached (the smaller), from the fit to all
    of the compute and from the fit to its first half: worse / no difference / better / cannot tell yet."""
    rows = []
    for v in model.budgets:
        if v == "baseline":
            continue
        where = min(model.budgets[v], model.budgets.get("baseline", np.inf))
        row: dict[str, Any] = {"variant": v}
        for m, key in ((model, "call"), (half, "half_call")):
            if "baseline" not in m.forecasts or v not in m.forecasts:
                why = m.failed.get(v if v not in m.forecasts else "baseline", "no fit")
                row[key], row[f"{key}_text"] = "cannot tell yet", f"cannot tell yet: {why}"
                continue
            c = call_difference(m.forecasts[v], m.forecasts["baseline"], where, margin=margin)
            row[key], row[f"{key}_text"] = c.label, c.text(margin)
            row[f"{key}_delta"], row[f"{key}_lo"], row[f"{key}_hi"] = c.delta, c.lo, c.hi
        rows.append(row)
    return pd.DataFrame(
        rows, columns=["variant", "call", "call_text", "half_call", "half_call_text"] if not rows else None
    )


def _resolvable(curves: pd.DataFrame, x: str, cfg: FitSettings) -> pd.DataFrame:
    """The smallest difference each comparison resolves at the budget (80% power; ``analysis.planner``)."""
    rows = seed_plan(curves, x, cfg.margin, cfg.last_k).rows
    out = pd.DataFrame(rows, columns=["variant", "resolvable", "resolvable_last_k"] if not rows else None)
    return out[["variant", "resolvable", "resolvable_last_k"]]


def measured_at_budget(
    curves: pd.DataFrame, x: str, margin: float, level: float = 0.95, fraction: float = 1.0, last_k: int = 3
) -> pd.DataFrame:
    """Each variant against the baseline where both were measured, no extrapolation.

    At ``fraction`` of the smaller of the two final computes (1: the budget; 0.5: half of it, where
    a difference in efficiency shows before curves that reach the same plateau meet), each seed's
    mean@16 (interpolated between its evaluations), and beside it each seed's mean over its last
    ``last_k`` evaluations up to there (less noisy than one evaluation); the difference of the seed
    means with a t interval whose seed-to-seed s.d. is pooled over every variant of the campaign at
    that fraction of its own final compute (df = Σ(seeds − 1)): seeds are the unit of uncertainty,
    evaluation noise included. The label uses the paper's margin:
    ``worse`` / ``better`` (the whole interval beyond it), ``within the margin`` (inside it), else
    ``not resolved``. Valid whatever the fits say: it describes the budget that was run.
    """
    from scipy import stats

    def at(g: pd.DataFrame, where: float, k: int) -> np.ndarray:
        out = []
        for _, gs in g.sort_values(x).groupby("seed"):
            if k == 1:
                out.append(float(np.interp(where, gs[x], gs[MEAN_AT_16])))
            else:
                before = gs.loc[gs[x] <= where * (1 + 1e-9), MEAN_AT_16].to_numpy()
                out.append(float(before[-k:].mean()) if len(before) else np.nan)
        return np.array(out)

    groups = dict(tuple(curves.groupby("variant", sort=False)))
    if "baseline" not in groups:
        return pd.DataFrame(columns=["variant"])
    ends = {v: float(g.groupby("seed")[x].max().min()) for v, g in groups.items()}
    cols: dict[str, dict[str, Any]] = {}
    for k, prefix in ((1, "measured"), (last_k, f"measured_last{last_k}")):
        finals = {v: at(g, fraction * ends[v], k) for v, g in groups.items()}
        df = sum(len(v) - 1 for v in finals.values())
        sd = float(np.sqrt(sum(((v - v.mean()) ** 2).sum() for v in finals.values()) / df)) if df else np.nan
        t = float(stats.t.ppf(0.5 + level / 2, df)) if df else np.nan
        for v, g in groups.items():
            if v == "baseline":
                continue
            where = fraction * min(ends[v], ends["baseline"])
            b, c = at(groups["baseline"], where, k), at(g, where, k)
            delta = float(c.mean() - b.mean())
            half = t * sd * np.sqrt(1 / len(b) + 1 / len(c)) if df else np.nan
            lo, hi = delta - half, delta + half
            side = against_margin(lo, hi, margin) if df else "one seed each: no interval"
            label = {"within": f"within the margin ±{margin:g}", None: "not resolved"}.get(side, side)
            text = f"{label}: Δ {delta:+.3f}" + (f" [{lo:+.3f}, {hi:+.3f}]" if df else "")
            row = cols.setdefault(v, {"variant": v, "budget": where})
            row.update({f"{prefix}_delta": delta, f"{prefix}_lo": lo, f"{prefix}_hi": hi, f"{prefix}_label": label})
            row[prefix] = text + (f" at {where:.3g} {x.split('/')[-1]}" if k == 1 else "")
    return pd.DataFrame(list(cols.values()))


def _unfinished(g: pd.DataFrame) -> int:
    """How many of a variant's runs neither finished nor were stopped by a decision (still running,
    or failed): their curves end where they stopped logging."""
    if "done" not in g:
        return 0
    ended = g["done"].astype(bool)
    if "stopped" in g:
        ended |= g["stopped"].fillna("") != ""
    return int(g.loc[~ended, "seed"].nunique())  # one run per seed (``_one_run_per_seed``)


def steady_points(curves: pd.DataFrame) -> tuple[pd.DataFrame, list[Flag]]:
    """The evaluations a fit should hold, and the runs flagged unstable (``scalefit.unstable``: a
    seed that leaves its siblings by a robust margin at a step). The flagged evaluations are left out
    of the fit, as one collapse would otherwise move its variant's curve and every verdict; they stay
    in curves.csv and the plot (red crosses), and each run is named in its variant's row."""
    hit, flags = unstable_points(curves)
    return curves[~hit], flags


def unstable_points(curves: pd.DataFrame) -> tuple[np.ndarray, list[Flag]]:
    """Which rows of ``curves`` are flagged evaluations (a boolean mask), and the flagged runs."""
    if "step" not in curves or curves.empty:
        return np.zeros(len(curves), dtype=bool), []
    flags = flag_runs(curves, MEAN_AT_16)
    out = {(f.variant, f.seed, s) for f in flags for s in f.steps}
    keys = zip(curves["variant"], curves["seed"], curves["step"], strict=True)
    return np.array([(v, int(s), int(t)) in out for v, s, t in keys], dtype=bool), flags


def bad_points(curves: pd.DataFrame, x: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The points a curve can hold, and those it cannot (``variant``, ``why``: run, step, column and
    value): a mean@16 that is not a pass rate in [0, 1] (NaN included), or compute (``x``) that is not
    a finite number >= 0. Left out by name, one bad point spoils neither its variant nor, through the
    campaign's shared R0, every other one."""
    y = pd.to_numeric(curves[MEAN_AT_16], errors="coerce")
    c = pd.to_numeric(curves[x], errors="coerce")
    bad_y, bad_c = (~y.between(0, 1)).to_numpy(), (~(np.isfinite(c) & (c >= 0))).to_numpy()
    rows = []
    for i in np.flatnonzero(bad_y | bad_c):  # by position: an index may repeat (frames joined in a notebook)
        col = MEAN_AT_16 if bad_y[i] else x
        rows.append({"variant": curves["variant"].iloc[i], "why": _bad_point(curves.iloc[i], col, float(c.iloc[i]))})
    good = ~(bad_y | bad_c)
    clean = curves[good].assign(**{MEAN_AT_16: y.to_numpy()[good], x: c.to_numpy()[good]})
    return clean, pd.DataFrame(rows, columns=["variant", "why"])


def _bad_point(r: pd.Series, col: str, c: float) -> str:
    """A bad point named (run, step, column, value) with what is wrong with it: its mean@16, or its compute ``c``."""
    run = r["run"] if "run" in r else f"{r['variant']}/seed{r['seed']}"
    if col == MEAN_AT_16:
        why = "is not a pass rate in [0, 1]"
    else:
        why = "is negative: compute spent starts at 0 and only grows" if c < 0 else "is not a finite number"
    v = r[col]
    return f"{run} step {r['step']}: {col} = {f'{v:g}' if isinstance(v, float) else repr(v)} {why}"


def _note_dropped(rows: list[dict[str, Any]], dropped: pd.DataFrame) -> list[dict[str, Any]]:
    """The table's rows with each variant's bad points (``bad_points``): every one in its note, the
    first three in ``dropped`` (the Markdown table's); a variant with no point left gets a row."""
    whys = {v: list(w) for v, w in dropped.groupby("variant")["why"]}
    for row in rows:
        if row["variant"] in whys:
            w = whys.pop(row["variant"])
            said = f"{len(w)} bad point(s) left out: {'; '.join(w)}"
            brief = f"{len(w)} bad point(s) left out: {'; '.join(w[:3])}" + ("; …" if len(w) > 3 else "")
            row.update(dropped=brief, note="; ".join(filter(None, [row.get("note", ""), said])))
    left = [{"variant": v, "seeds": 0, "points": 0, "note": "no fit: every point is bad"} for v in whys]
    return rows + _note_dropped(left, dropped[dropped["variant"].isin(whys)]) if left else rows


def _spliced(g: pd.DataFrame, x: str) -> str | None:
    """Why a variant's curves cannot be fitted because a seed's compute falls as its step rises
    (two runs spliced into one history), or None."""
    for seed, gs in g.sort_values("step").groupby("seed"):
        values = gs[x].to_numpy()
        drop = np.flatnonzero(np.diff(values) < 0)
        if len(drop):
            i = drop[0]
            steps = gs["step"].to_numpy()
            return (
                f"seed {seed}: {x} goes backwards ({values[i]:.4g} at step {steps[i]}, {values[i + 1]:.4g} at step "
                f"{steps[i + 1]}): two runs spliced into one history"
            )
    return None


def _flag_identical_curves(curves: pd.DataFrame, table: pd.DataFrame, x: str) -> pd.DataFrame:
    """Say when a variant's mean@16 curve equals the baseline's at every step: the axis did not act
    (any difference in the fit then comes from the compute axis alone)."""
    if "baseline" not in set(curves["variant"]):
        return table
    key = ["seed", "step"]
    base = curves[curves["variant"] == "baseline"].set_index(key)[MEAN_AT_16]
    same = []
    for v in table["variant"]:
        g = curves[curves["variant"] == v].set_index(key)[MEAN_AT_16]
        common = base.index.intersection(g.index)
        same.append(v != "baseline" and len(common) == len(g) > 0 and bool(np.allclose(base[common], g[common])))
    table["identical_to_baseline"] = same
    if "verdict" in table:
        table.loc[table["identical_to_baseline"], "verdict"] = (
            "identical mean@16 to the baseline at every step: the axis did not act here (any difference in the "
            f"fit comes from {x} alone)"
        )
    return table


def _short_verdict(c, base: Forecast, cand: Forecast) -> str:
    """The paper's verdict with its significance under the calibrated uncertainty of both fits."""
    if c.rule == "undecided":
        return c.verdict
    level = f"{base.level:.0%}"
    if c.rule == "value":  # no asymptote to compare (a power law): the predicted values at the budget
        d = c.value_candidate - c.value_baseline
        where = f"predicted value at the budget {c.budget:.4g} (no asymptote to compare)"
        if c.winner == "tie" and abs(d) <= base.margin:
            return f"no measurable difference: same {where} within ±{base.margin} (Δ {d:+.3f})"
        text = f"{'better' if d > 0 else 'worse'} {where}: Δ {d:+.3f}"
        if c.delta_value_interval is not None:
            d_lo, d_hi = c.delta_value_interval
            text += f", {level} interval [{d_lo:+.3f}, {d_hi:+.3f}]"
            text += ": not significant" if d_lo <= 0 <= d_hi else ""
        return text
    if c.winner == "tie" and c.rule == "B":
        return f"tie (same A within ±{abs(c.A_baseline - c.A_candidate):.3f}, same B)"
    tie = base.b_tie(cand, c.B_candidate) if c.rule == "B" else None
    if tie is not None:  # the baseline's model says how its uncertainty cannot tell the two B's apart
        return (
            f"no measurable difference: same A within margin; refitted at shared A = {c.shared_A:.3f}, "
            f"B {c.B_candidate:.2f} vs {c.B_baseline:.2f}{tie}"
        )
    if c.rule == "A":
        better = c.A_candidate > c.A_baseline
        text = f"{'better' if better else 'worse'} asymptote (ΔA {c.A_candidate - c.A_baseline:+.3f}"
        if c.delta_A_interval is not None:
            d_lo, d_hi = c.delta_A_interval
            text += f", {level} interval [{d_lo:+.3f}, {d_hi:+.3f}])"
            if d_lo <= 0.0 <= d_hi:
                text += ": not significant"
        else:
            text += ")"
        return text
    better = c.winner == c.candidate
    return (
        f"same A within margin; {'more' if better else 'less'} compute-efficient "
        f"(B {c.B_candidate:.2f} vs {c.B_baseline:.2f} at A={c.shared_A:.3f})"
    )


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ""


def to_markdown(table: pd.DataFrame) -> str:
    def fmt(v: Any, spec: str) -> str:
        return "" if v is None or (isinstance(v, float) and np.isnan(v)) else format(v, spec)

    k = next((int(c[len("final_last") : -len("_mean_at_16")]) for c in table if c.startswith("final_last")), 3)
    lines = []
    models = [m for m in table.get("fit_model", pd.Series(dtype=object)).dropna().unique() if m]
    if models:
        lines += [f"Fit: {models[0]}.", ""]
    fitted = table.get("model", pd.Series(dtype=object)).dropna()
    names = make_model(fitted.iloc[0] if len(fitted) else "sigmoid").param_names  # the table's columns
    heads = ["A [interval]" if p == "A" and "A_lo" in table else p for p in names]
    lines += [
        f"| variant | {' | '.join(heads)} | final mean@16 (last " + str(k) + ") | predictable? "
        "| verdict vs baseline | call at half the budget → at the budget | measured at the budget (95%, seeds; "
        f"last {k}) | measured at half the budget | resolvable Δ (80%; last {k}) |",
        "|---|" + "---|" * len(names) + "---|---|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():
        cells = []
        for p in names:
            if p == "A":
                a = (
                    f"{r['A']:.3f} [{r['A_lo']:.3f}, {r['A_hi']:.3f}]"
                    if "A" in r and not pd.isna(r.get("A")) and not pd.isna(r.get("A_lo"))
                    else (f"{r['A']:.3f}" + (" (no band)" if "A_lo" in r else "") if not pd.isna(r.get("A")) else "")
                )
                cells.append(a + (" (grid edge)" if r.get("a_at_edge") is True else ""))
            elif p == "B":
                cells.append(fmt(r.get("B"), ".2f") + (" (bound)" if r.get("b_at_bound") is True else ""))
            else:
                cells.append(fmt(r.get(p), ".3g"))
        if pd.isna(r.get(names[0])):  # no fit: the first parameter's cell says why
            cells[0] = r.get("note", "")
        pred = r.get("predictability", "")
        pred = "" if not isinstance(pred, str) else pred
        verdict = r.get("verdict", "")
        stopped = r.get("stopped")
        if isinstance(stopped, str) and stopped:  # the numbers are predictions, not observations
            verdict = f"{verdict} — {stopped} (prediction)" if verdict else f"{stopped} (prediction)"
        final = fmt(r["final_mean_at_16"], ".3f")
        last = r.get(f"final_last{k}_mean_at_16")
        if last is not None and not pd.isna(last):
            final += f" ({last:.3f})"
        if r.get("unfinished", 0) > 0:  # a partial curve: its last value is not the run's final one
            final += f" ({r['unfinished']:.0f} of {r['seeds']} runs unfinished)"
        if _text(r.get("dropped")):  # points no curve can hold, left out of the fit by name
            final += f" ({r['dropped']})"
        if _text(r.get("unstable")):  # runs that left their siblings: counted and named
            final += f" (unstable: {r['unstable']}; flagged evaluations left out of the fit)"
        calls = ""
        if _text(r.get("half_call_text")) or _text(r.get("call_text")):
            calls = f"{_text(r.get('half_call_text'))} → {_text(r.get('call_text'))}"
        measured = _text(r.get("measured"))
        if _text(r.get(f"measured_last{k}")):
            measured += f" (last {k}: {_text(r.get(f'measured_last{k}'))})"
        half = _text(r.get("half_measured"))
        if _text(r.get(f"half_measured_last{k}")):
            half += f" (last {k}: {_text(r.get(f'half_measured_last{k}'))})"
        res = ""
        if not pd.isna(r.get("resolvable", np.nan)):
            res = f"{r['resolvable']:.3f} ({r['resolvable_last_k']:.3f})"
        lines.append(
            f"| {r['variant']} | {' | '.join(cells)} | {final} | {pred} | {verdict} | {calls} | "
            f"{measured} | {half} | {res} |"
        )
    return "\n".join(lines) + "\n"


def extrapolation_check(
    curves: pd.DataFrame,
    settings: FitSettings,
    frac: float = 0.5,
    n_boot: int = HALF_RESAMPLES,
    model: Model | None = None,
) -> pd.DataFrame:
    """Fit the campaign on each variant's first ``frac`` of compute (jointly unless ``fit.pooling:
    none``) and predict each variant's final value (``model``: that fit, when already made). A
    variant whose first ``frac`` holds too few evaluations to fit is fitted on the smallest share
    that holds enough (``fit_share``, in the row).

    Two targets, side by side: the mean over seeds of each seed's last evaluation, and of each
    seed's mean over its last ``fit.last_k`` evaluations (less noisy). For each: the prediction,
    the error (predicted - observed), the band for that mean of the variant's seeds at the
    campaign's level, whether the observation landed in it and the standardised error (z); then
    the forecast's verdict and expected error. A variant that is not a sigmoid has no band. This
    is the paper's claim put to the test: a curve fitted early predicts late.
    """
    x, y, k = settings.x, MEAN_AT_16, settings.last_k
    curves = bad_points(curves, x)[0]
    model = model or campaign_model(curves, settings, n_boot, fraction=frac)
    rows = []
    for variant, g in curves.groupby("variant", sort=False):
        by_seed = g.sort_values(x).groupby("seed")
        last = by_seed.last()
        tail = by_seed.tail(k)
        x_end, observed = float(last[x].mean()), float(last[y].mean())
        x_tail = tail[x].to_numpy(float)  # every seed's last k: their mean is the mean of the seeds' means
        window = int(tail.groupby("seed").size().min())  # fewer than k where a seed has fewer evaluations
        budget = float(g[x].max())
        upto = model.fit_upto.get(variant)  # none: no share holds a fit and a point after it (or fitted on all)
        share = None if upto is None else upto / budget
        upto = frac * budget if upto is None else upto
        row = {"variant": variant, "fit_share": share, "fit_upto": upto, "x_final": x_end, "observed": observed}
        row[f"observed_last{k}"] = float(tail[y].mean())  # less sensitive to one noisy evaluation
        row["last_k"] = k
        if variant not in model.fits:
            row["note"] = model.failed.get(variant, "no fit")
            rows.append(row)
            continue
        f, fc = model.fits[variant], model.forecasts[variant]
        seeds = len(last)
        pred = float(f.predict(np.array([x_end]))[0])
        pred_k = float(f.predict(x_tail).mean())
        row.update(A_half=f.params.get("A", np.nan), predicted=pred, error=pred - observed)
        row[f"predicted_last{k}"] = pred_k
        row[f"error_last{k}"] = pred_k - row[f"observed_last{k}"]
        # a k-seed mean of one evaluation, and of the last k where the model has a noise estimate for them
        lo, hi = fc.target_band([x_end], seeds)
        sd = fc.expected_error_at([x_end], seeds)
        lo_k, hi_k, sd_k = np.nan, np.nan, np.nan  # no noise estimate for a window this short: no band
        if window in fc.mean_windows:
            lo_k, hi_k = fc.target_band(x_tail, seeds, window=window)
            sd_k = fc.expected_error_at(x_tail, seeds, window)
        row.update(band_lo=lo, band_hi=hi, in_band=bool(lo <= observed <= hi), z=(pred - observed) / sd)
        row.update(
            {
                f"band_last{k}_lo": lo_k,
                f"band_last{k}_hi": hi_k,
                f"in_band_last{k}": bool(lo_k <= row[f"observed_last{k}"] <= hi_k),
                f"z_last{k}": row[f"error_last{k}"] / sd_k,
                f"expected_error_last{k}": sd_k,
            }
        )
        row.update(
            level=settings.level,
            verdict=fc.verdict.label,
            reasons="; ".join(fc.verdict.reasons),
            expected_error=fc.expected_error,
            fit_model=model.description,
        )
        rows.append(row)
    return pd.DataFrame(rows)


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


def write_missing_reports(curves: pd.DataFrame, client: MlflowClient, out: Path, log=print) -> int:
    """Each finished run gets its report under ``out/reports/`` (``report_folder``): one written
    earlier and logged to the run is copied from there, and a run without one gets one written
    (``analysis.report``) and logged to it; a report that fails is named, and the rest go on.
    Returns how many were written."""
    from analysis.report import write_run_report

    written = 0
    ended = curves["done"] | (curves["stopped"].fillna("") != "") if "stopped" in curves else curves["done"]
    for run_id, g in curves[ended].groupby("run_id", sort=False):
        folder = report_folder(out, g["variant"].iloc[0], g["seed"].iloc[0])
        if (folder / "report.md").is_file():
            continue
        if client.get_run(run_id).data.tags.get(store.REPORT):
            _copy_logged_report(client, run_id, folder)
            continue
        try:
            write_run_report(run_id, folder, tracking_uri=client.tracking_uri)
            written += 1
        except Exception as e:  # noqa: BLE001 - one run's plots must not stop the campaign's table
            log(f"warning: no report for run {run_id} ({type(e).__name__}: {e})")
    if written:
        log(f"run reports: {written} written under {out}/ and logged to their runs")
    return written


def _copy_logged_report(client: MlflowClient, run_id: str, folder: Path) -> None:
    """A run's logged report (artifacts ``report/``) into ``folder``, complete or not at all."""
    import shutil
    import tempfile

    from mlflow.artifacts import download_artifacts

    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        got = download_artifacts(run_id=run_id, artifact_path="report", dst_path=tmp, tracking_uri=client.tracking_uri)
        shutil.rmtree(folder, ignore_errors=True)
        Path(got).rename(folder)


def write_fit(curves: pd.DataFrame, out: Path, settings: FitSettings, title: str = "") -> pd.DataFrame:
    """From curves (as ``load_curves`` or a published ``curves.csv`` holds them): the LOO table
    (CSV + Markdown), the plot with both bands, and the extrapolation check, under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    half = campaign_model(curves, settings, HALF_RESAMPLES, fraction=0.5)
    table, extra = fit_table(curves, settings, half=half)
    table.to_csv(out / "loo_table.csv", index=False)
    (out / "loo_table.md").write_text(to_markdown(table))
    plot_campaign(curves, extra, out / "loo_curves.png", settings, title)
    extrapolation_check(curves, settings, model=half).to_csv(out / "extrapolation.csv", index=False)
    return table


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
    return plot_fits(
        extra["fits"],
        path,
        forecasts=extra["forecasts"],
        xlabel=x,
        title=f"{title}: mean@16 vs compute, {settings.model.replace('_', ' ')} fits" if title else None,
        unfitted=unfitted,
        flagged=(left_out[x].to_numpy(float), left_out[MEAN_AT_16].to_numpy(float)),
    )


def tag_unstable(curves: pd.DataFrame, client: MlflowClient) -> None:
    """Each flagged run gets its flag as the MLflow tag ``store.UNSTABLE`` (the Flag's text); a run
    flagged by an earlier fit and steady now loses it."""
    flags = {(f.variant, f.seed): f.text() for f in steady_points(curves)[1]}
    for (variant, seed), run_id in curves.groupby(["variant", "seed"])["run_id"].first().items():
        if (variant, seed) in flags:
            client.set_tag(run_id, store.UNSTABLE, flags[(variant, seed)])
        elif store.UNSTABLE in client.get_run(run_id).data.tags:
            client.delete_tag(run_id, store.UNSTABLE)


def write_report(
    campaign: str,
    out: Path,
    settings: FitSettings,
    tracking_uri: str | None = None,
    parent_run_id: str | None = None,
    log=print,
    current: set[str] | None = None,
) -> pd.DataFrame:
    """Curves CSV, LOO table (CSV + Markdown), plot, extrapolation check and runs list from MLflow;
    logged to the campaign's parent run. ``current``: as ``load_curves``."""
    out.mkdir(parents=True, exist_ok=True)
    curves = load_curves(campaign, tracking_uri, current, log=log)
    curves.to_csv(out / "curves.csv", index=False)
    table = write_fit(curves, out, settings, title=campaign)
    client = store.read_client(tracking_uri)
    tag_unstable(curves, client)
    write_missing_reports(curves, client, out, log=log)
    (out / "runs.md").write_text(runs_markdown(curves, out))
    identical = set(table.loc[table["identical_to_baseline"], "variant"]) if "identical_to_baseline" in table else set()
    mechanisms = evidence.acted(evidence.mechanism_runs(curves, client), identical)
    mechanisms.to_csv(out / "mechanisms.csv", index=False)
    (out / "mechanisms.md").write_text(evidence.to_markdown(mechanisms))
    if parent_run_id is None:
        parent = store.parent_run(client, store.experiment_id(client, campaign))
        parent_run_id = parent.info.run_id if parent else None
    if parent_run_id:
        names = ("curves.csv", "loo_table.csv", "loo_table.md", "loo_curves.png", "extrapolation.csv", "runs.md")
        for name in (*names, "mechanisms.md", "mechanisms.csv"):
            if (out / name).is_file():
                client.log_artifact(parent_run_id, str(out / name), "loo")
    return table

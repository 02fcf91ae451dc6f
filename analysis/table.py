"""The LOO table, the third part of ``analysis fit``: one row per variant with its fit, verdict against
the baseline, calls at half the budget and at the budget, and what was measured (``fit_table``); the
extrapolation check of the fit to half the compute (``extrapolation_check``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from analysis import builds
from analysis.curves import bad_points, steady_points, unfinished, unstable_points
from analysis.fits import HALF_RESAMPLES, Model, campaign_model, warn_wall_clock
from analysis.planner import plan as seed_plan
from runners.contract import MEAN_AT_16
from scalefit import CurveFit, FitError, compare_fits, seed_spread
from scalefit.data.unstable import Flag, arm_counts
from scalefit.decide.bounded import Bound, doublings, largest_rise
from scalefit.forecasts.interface import Forecast, against_margin, call_difference
from scalefit.forecasts.settings import FitSettings
from scalefit.reasons import Reason


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
    x = settings.x
    curves, dropped = bad_points(curves, x)  # each named in its variant's note; the other points are fitted
    if curves.empty:
        raise ValueError(f"no evaluation to fit: every point is bad ({dropped['why'].iloc[0]}, ...)")
    model = campaign_model(curves, settings, n_boot)
    flags = steady_points(curves)[1]
    rows = [variant_row(v, g, model, settings, flags) for v, g in curves.groupby("variant", sort=False)]
    table = frame(_note_dropped(rows, dropped))
    if "baseline" in model.fits:
        table = _against_baseline(table, model, settings.margin)
    if half is None:  # never more resamples than the fit to all of it
        half = campaign_model(curves, settings, min(n_boot, HALF_RESAMPLES), fraction=0.5)
    table = table.merge(calls(model, half, settings.margin, curves, x, settings.last_k), on="variant", how="left")
    arms = set(model.fits)  # the seed noise of a measured comparison: arms with a fit only
    measured = measured_at_budget(curves, x, settings.margin, last_k=settings.last_k, arms=arms)
    if len(measured):
        table = table.merge(measured, on="variant", how="left")
        half_m = measured_at_budget(curves, x, settings.margin, fraction=0.5, last_k=settings.last_k, arms=arms)
        half_m = half_m.rename(columns=lambda c: c if c == "variant" else f"half_{c}")  # where efficiency shows
        table = table.merge(half_m, on="variant", how="left")
        table = table.merge(measured_steady(curves, flags, settings, arms), on="variant", how="left")
    table = table.merge(_resolvable(curves, x, settings), on="variant", how="left")
    table = _flag_identical_curves(curves, table, x)
    if (built := builds.column(curves)) is not None:  # the base models the runs started from
        table = table.merge(built, on="variant", how="left")
    return table, {"fits": model.fits, "forecasts": model.forecasts, "model": model, "half": half, "table": table}


@dataclass(frozen=True)
class FitCells:
    """A fitted variant's cells: its model's parameters, A's interval, its verdict and the per-seed
    spread of A (None: not computed)."""

    model: str
    params: dict[str, float]  # the model's own: A, B, C_mid (sigmoid); A, D, B (power law)
    a_interval: tuple[float, float] | None  # (A_lo, A_hi), for a model with an asymptote
    R0: float
    sse: float
    a_at_edge: bool
    b_at_bound: bool
    pooled: str
    predictable: bool
    predictability: str
    expected_error: float
    predictability_short: str = ""  # the verdict's first reason in a few words (``Reason.short``; the summary's)
    p_within: float | None = None  # P(the seeds' mean at the target lands within ±margin): Forecast.p_within
    a_seed_half_range: float | None = None


@dataclass(frozen=True)
class VariantRow:
    """A variant's row of the table; a cell that is None is absent (a variant with no point left has
    only its name, counts and note)."""

    variant: str
    seeds: int
    points: int
    note: str
    axis: str | None = None
    final_mean_at_16: float | None = None
    final_last_mean_at_16: float | None = None  # over the last ``last_k`` evaluations of each seed
    last_k: int = 0
    unfinished: int | None = None
    fit_model: str | None = None
    unstable_runs: int | None = None
    unstable: str | None = None
    stopped: str | None = None
    fit: FitCells | None = None
    dropped: str | None = None
    note_short: str | None = None  # why it has no fit, in a few words (``Reason.short``; the summary's)

    def cells(self) -> dict[str, Any]:
        """The row as the table's columns, in the table's order."""
        out = {
            "variant": self.variant,
            "axis": self.axis,
            "seeds": self.seeds,
            "points": self.points,
            "final_mean_at_16": self.final_mean_at_16,
            f"final_last{self.last_k}_mean_at_16": self.final_last_mean_at_16,
            "unfinished": self.unfinished,
            "fit_model": self.fit_model,
            "unstable_runs": self.unstable_runs,
            "unstable": self.unstable,
            "stopped": self.stopped,
        }
        out = {k: v for k, v in out.items() if v is not None}
        f = self.fit
        if f is not None:
            out["model"] = f.model
            out.update(f.params)
            if f.a_interval is not None:
                out["A_lo"], out["A_hi"] = f.a_interval
            out.update(R0=f.R0, sse=f.sse, a_at_edge=f.a_at_edge, b_at_bound=f.b_at_bound, pooled=f.pooled)
            out.update(predictable=f.predictable, predictability=f.predictability, expected_error=f.expected_error)
            out["p_within"] = f.p_within
            out["predictability_short"] = f.predictability_short
        out["note"] = self.note
        if self.note_short is not None:
            out["note_short"] = self.note_short
        if f is not None and f.a_seed_half_range is not None:
            out["A_seed_half_range"] = f.a_seed_half_range
        if self.dropped is not None:
            out["dropped"] = self.dropped
        return out


SHORT_COLUMNS = ("predictability_short", "note_short", "call_short", "half_call_short")  # the summary's only


def _short(why: str) -> str | None:
    """A reason's short form where it is one as data (``scalefit.reasons.Reason``); None where it is
    only text (the summary then says less, never parses it)."""
    return why.short() if isinstance(why, Reason) else None


def frame(rows: list[VariantRow]) -> pd.DataFrame:
    """The rows as the table's DataFrame: a column for each cell some row has, in order of appearance."""
    return pd.DataFrame([row.cells() for row in rows])


def variant_row(variant: str, g: pd.DataFrame, model: Model, settings: FitSettings, flags: list[Flag]) -> VariantRow:
    """A variant's row of the table: its runs (``g``: its curves) and, where it has one, its fit."""
    x, y, k = settings.x, MEAN_AT_16, settings.last_k
    mine = [f.text() for f in flags if f.variant == variant]
    stops = sorted(set(g["stopped"].fillna(""))) if "stopped" in g else []
    row = VariantRow(
        variant=variant,
        axis=g["axis"].iloc[0] or "—",
        seeds=g["seed"].nunique(),
        points=len(g),
        final_mean_at_16=g.sort_values(x).groupby("seed")[y].last().mean(),
        final_last_mean_at_16=g.sort_values(x).groupby("seed").tail(k)[y].mean(),
        last_k=k,
        unfinished=unfinished(g),
        fit_model=model.description,
        # collapses: reported, left out of the fit and the seed noise, kept in the curves
        unstable_runs=len(mine) if mine else None,
        unstable=f"{arm_counts(g, flags)[variant]}: {'; '.join(mine)}" if mine else None,
        # an adaptive campaign stopped it: its final value is the decision's prediction
        stopped="stopped early " + "; ".join(s for s in stops if s) if any(stops) else None,
        note=model.failed.get(variant, "no fit"),
    )
    if variant not in model.fits:
        return replace(row, note_short=_short(row.note))
    fit, note = _fit_cells(g, model.fits[variant], model.forecasts[variant], settings)
    return replace(row, fit=fit, note=note)


def _fit_cells(g: pd.DataFrame, f: Any, fc: Forecast, settings: FitSettings) -> tuple[FitCells, str]:
    """A fitted variant's cells (parameters, intervals, verdict, per-seed spread of A) and its note."""
    prior, pool_note = f.pooling()
    ceiling = f.parameters.ceiling
    cells = FitCells(
        model=f.name,
        params=dict(f.params),
        a_interval=fc.interval(ceiling) if ceiling is not None else None,
        R0=np.nan if f.start_level is None else f.start_level,
        sse=f.sse,
        a_at_edge=f.ceiling_at_edge,
        b_at_bound=f.efficiency_at_bound,
        pooled=_pooled_label(prior, pool_note),
        predictable=fc.verdict.predictable,
        predictability=fc.verdict.text(),
        expected_error=fc.expected_error,
        p_within=fc.p_within,
        predictability_short=fc.verdict.short(),
    )
    note = "; ".join(filter(None, [*f.warnings, pool_note]))
    if g["seed"].nunique() > 1 and ceiling is not None:  # the paper's run-to-run spread of the ceiling
        try:
            per_seed = {s: (gs[settings.x], gs[MEAN_AT_16]) for s, gs in g.groupby("seed")}
            spread = seed_spread(
                per_seed, model=f.name, exclude_below=settings.exclude_below, a_grid=settings.a_values
            ).to_dict()
            cells = replace(cells, a_seed_half_range=spread["A_half_range"])
        except FitError as e:  # the pooled fit stands; one seed alone (e.g. a flat one) has no sigmoid
            note = "; ".join(filter(None, [note, f"no per-seed A spread: {e}"]))
    return cells, note


def _against_baseline(table: pd.DataFrame, model: Model, margin: float) -> pd.DataFrame:
    """The paper's verdict of each fitted variant against the baseline, and its B at the shared A."""
    fits, fcs = model.fits, model.forecasts
    verdicts, b_shared = [], []
    for v in table["variant"]:
        if v == "baseline" or v not in fits:
            verdicts.append("baseline" if v == "baseline" else "")
            b_shared.append(np.nan)
            continue
        c = compare_fits(
            fits["baseline"], fits[v], margin=margin, names=("baseline", v), forecasts=(fcs["baseline"], fcs[v])
        )
        verdicts.append(_short_verdict(c, fcs["baseline"], fcs[v]))
        b_shared.append(c.B_candidate if c.rule == "B" else np.nan)
    table["verdict"] = verdicts
    table["B_at_shared_A"] = b_shared
    return table


def _pooled_label(prior: Any, note: str) -> str:
    """How a variant's B was fitted: pooled with the campaign's, alone (and why), or on its own."""
    if prior is not None:
        return f"pooled (campaign B {prior.B:.2f})"
    return f"alone: {note}" if note else "alone"


def calls(
    model: Model, half: Model, margin: float, curves: pd.DataFrame | None = None, x: str = "", last_k: int = 3
) -> pd.DataFrame:
    """Each variant against the baseline at the budget both reached (the smaller), from the fit to all
    of the compute and from the fit to its first half: worse / no difference / better / cannot tell yet,
    each with its reading where the fits are sigmoids (``reading``, ``half_reading``: lower, higher,
    slower, faster, same, or what is not yet told; ``scalefit.forecasts.slower_or_lower``). Given the campaign's
    ``curves`` (compute column ``x``), a call the fits leave at "cannot tell yet" is "worse" where the
    data bound it so (``bounded_worse``)."""
    out = _fit_calls(model, half, margin)
    return out if curves is None or out.empty else bounded_worse(out, curves, x, margin, set(model.fits), last_k)


def bounded_worse(
    called: pd.DataFrame, curves: pd.DataFrame, x: str, margin: float, arms: set[str], last_k: int = 3
) -> pd.DataFrame:
    """``called`` with each "cannot tell yet" turned "worse" where the data bound it (``scalefit.decide.bounded``;
    flagged evaluations left out, as in the fit). At the budget: the measured comparison of the seeds'
    last-``last_k`` means lies below -margin (``measured_at_budget``). At half of it: the seeds' levels
    there (interpolated) lie below the baseline's by more than any rise the campaign has shown in one
    doubling up to half of each arm's compute, plus the margin, across the difference's interval."""
    steady = steady_points(bad_points(curves, x)[0])[0]
    groups = {
        v: [(gs[x].to_numpy(float), gs[MEAN_AT_16].to_numpy(float)) for _, gs in g.sort_values(x).groupby("seed")]
        for v, g in steady.groupby("variant", sort=False)
    }
    ends = {v: float(g.groupby("seed")[x].max().min()) for v, g in steady.groupby("variant", sort=False)}
    out = called.copy()
    for key, fraction, col in (("call", 1.0, f"measured_last{last_k}"), ("half_call", 0.5, "measured")):
        m = measured_at_budget(steady, x, margin, fraction=fraction, last_k=last_k, arms=arms)
        if m.empty:
            continue
        m = m.set_index("variant")
        rise = largest_rise(groups, {v: fraction * e for v, e in ends.items()}) if fraction < 1 else 0.0
        for i, r in out.iterrows():
            v = r["variant"]
            if r[key] != "cannot tell yet" or v not in m.index:
                continue
            b = Bound(*(float(m.loc[v, f"{col}{c}"]) for c in ("_delta", "_lo", "_hi")), rise, doublings(fraction, 1.0))
            if b.worse(margin):
                said = b.text(margin, last_k if fraction == 1 else 1)
                out.loc[i, [key, f"{key}_text", f"{key}_short"]] = ["worse", said, b.short()]
                out.loc[i, [f"{key}_delta", f"{key}_lo", f"{key}_hi"]] = [b.delta, b.lo, b.hi]
    return out


def _fit_calls(model: Model, half: Model, margin: float) -> pd.DataFrame:
    """``calls`` from the fits alone."""
    rows = []
    for v in model.budgets:
        if v == "baseline":
            continue
        where = min(model.budgets[v], model.budgets.get("baseline", np.inf))
        row: dict[str, Any] = {"variant": v}
        for m, key in ((model, "call"), (half, "half_call")):
            if "baseline" not in m.forecasts or v not in m.forecasts:
                if "baseline" in m.budgets or v not in m.forecasts:
                    why = m.failed.get(v if v not in m.forecasts else "baseline", "no fit")
                else:  # a scale campaign: no baseline arm, its sizes meet in sizes.md, not here
                    why = "no baseline arm to compare with (across sizes: sizes.md)"
                row[key], row[f"{key}_text"] = "cannot tell yet", f"cannot tell yet: {why}"
                row[f"{key}_short"] = _short(why)
                continue
            c = call_difference(m.forecasts[v], m.forecasts["baseline"], where, margin=margin)
            row[key], row[f"{key}_text"], row[f"{key}_short"] = c.label, c.text(margin), c.short()
            row[f"{key}_delta"], row[f"{key}_lo"], row[f"{key}_hi"] = c.delta, c.lo, c.hi
            if c.reading is not None:  # slower or lower: ceiling against efficiency
                reading = key.replace("call", "reading")
                row[reading], row[f"{reading}_text"] = c.reading.label, c.reading.text()
        rows.append(row)
    return pd.DataFrame(
        rows, columns=["variant", "call", "call_text", "half_call", "half_call_text"] if not rows else None
    )


def _resolvable(curves: pd.DataFrame, x: str, cfg: FitSettings) -> pd.DataFrame:
    """The smallest difference each comparison resolves at the budget (80% power; ``analysis.planner``)."""
    rows = seed_plan(curves, x, cfg.margin, cfg.last_k).rows
    out = pd.DataFrame(rows, columns=["variant", "resolvable", "resolvable_last_k"] if not rows else None)
    return out[["variant", "resolvable", "resolvable_last_k"]]


def measured_steady(curves: pd.DataFrame, flags: list[Flag], settings: FitSettings, arms: set[str]) -> pd.DataFrame:
    """The at-budget comparison of the last-k means without the flagged runs (``scalefit.data.unstable``),
    as columns ``steady_measured_last{k}`` (text), ``_delta``, ``_lo``, ``_hi``, ``_label``, for each
    variant whose comparison held one (the variant's or the baseline's); none where no run was flagged."""
    k = settings.last_k
    runs = {(f.variant, f.seed) for f in flags}
    hit = {v for v, _ in runs}
    if not runs:  # nothing flagged: the comparison is the measured one already
        return pd.DataFrame(columns=["variant"])
    keep = [(v, int(s)) not in runs for v, s in zip(curves["variant"], curves["seed"], strict=True)]
    steady = measured_at_budget(curves[keep], settings.x, settings.margin, last_k=k, arms=arms)
    if steady.empty:
        return pd.DataFrame(columns=["variant"])
    steady = steady[steady["variant"].isin(hit) | ("baseline" in hit)]
    cols = [c for c in steady if c.startswith(f"measured_last{k}")]
    return steady[["variant", *cols]].rename(columns={c: f"steady_{c}" for c in cols})


def measured_at_budget(
    curves: pd.DataFrame,
    x: str,
    margin: float,
    level: float = 0.95,
    fraction: float = 1.0,
    last_k: int = 3,
    arms: set[str] | None = None,
) -> pd.DataFrame:
    """Each variant against the baseline where both were measured, no extrapolation.

    At ``fraction`` of the smaller of the two final computes (1: the budget; 0.5: half of it, where
    a difference in efficiency shows before curves that reach the same plateau meet), each seed's
    mean@16 (interpolated between its evaluations), and beside it each seed's mean over its last
    ``last_k`` evaluations up to there (less noisy than one evaluation); the difference of the seed
    means with a t interval whose seed-to-seed s.d. is pooled over the variants in ``arms`` (those
    with a fit: an arm no curve describes, crashed or broken, does not set the others' noise; None,
    or arms holding no two seeds: every variant) at that fraction of its own final compute (df =
    Σ(seeds − 1)): seeds are the unit of uncertainty, evaluation noise included. The label uses the paper's margin:
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
        pooled = {v: f for v, f in finals.items() if v in (arms or ())}
        if sum(len(f) - 1 for f in pooled.values()) == 0:  # no fitted arm with two seeds: every arm
            pooled = finals
        df = sum(len(v) - 1 for v in pooled.values())
        sd = float(np.sqrt(sum(((v - v.mean()) ** 2).sum() for v in pooled.values()) / df)) if df else np.nan
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


def _note_dropped(rows: list[VariantRow], dropped: pd.DataFrame) -> list[VariantRow]:
    """The table's rows with each variant's bad points (``bad_points``): every one in its note, the
    first three in ``dropped`` (the Markdown table's); a variant with no point left gets a row."""
    whys = {v: list(w) for v, w in dropped.groupby("variant")["why"]}
    out = []
    for row in rows:
        if row.variant in whys:
            w = whys.pop(row.variant)
            said = f"{len(w)} bad point(s) left out: {'; '.join(w)}"
            brief = f"{len(w)} bad point(s) left out: {'; '.join(w[:3])}" + ("; …" if len(w) > 3 else "")
            row = replace(row, dropped=brief, note="; ".join(filter(None, [row.note, said])))
        out.append(row)
    bad = Reason("no_fit", parts=(Reason("all_bad"),))
    left = [VariantRow(variant=v, seeds=0, points=0, note=bad, note_short=bad.short()) for v in whys]
    return out + _note_dropped(left, dropped[dropped["variant"].isin(whys)]) if left else out


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
    x, k = settings.x, settings.last_k
    curves = bad_points(curves, x)[0]
    curves = curves.assign(flagged=unstable_points(curves)[0])  # out of the fit (steady_points): out of its target
    model = model or campaign_model(curves, settings, n_boot, fraction=frac)
    rows = []
    for variant, g in curves.groupby("variant", sort=False):
        end = _observed_end(g, x, k)
        budget = float(g[x].max())
        upto = model.fit_upto.get(variant)  # none: no share holds a fit and a point after it (or fitted on all)
        share = None if upto is None else upto / budget
        upto = frac * budget if upto is None else upto
        row = {"variant": variant, "fit_share": share, "fit_upto": upto, "x_final": end.x, "observed": end.observed}
        row[f"observed_last{k}"] = end.observed_k  # less sensitive to one noisy evaluation
        row["last_k"] = k
        if variant not in model.fits:
            row["note"] = model.failed.get(variant, "no fit")
            rows.append(row)
            continue
        fc = model.forecasts[variant]
        row.update(_predicted_end(model.fits[variant], fc, end, k))
        row.update(
            level=settings.level,
            verdict=fc.verdict.label,
            reasons="; ".join(fc.verdict.reasons),
            expected_error=fc.expected_error,
            fit_model=model.description,
        )
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class _End:
    """A variant's observed end: the mean final compute and value over seeds, and every seed's last
    ``k`` evaluations (``window``: fewer where a seed has fewer) with their mean."""

    x: float
    observed: float
    x_tail: np.ndarray
    observed_k: float
    window: int
    seeds: int


def _observed_end(g: pd.DataFrame, x: str, k: int) -> _End:
    """The end of one variant's curves (``g``), as the extrapolation check compares it: each seed's
    last evaluation and last ``k``, less those flagged unstable (column ``flagged``; where every one
    is, all of them)."""
    g = g.sort_values(x)
    last, tail = g.groupby("seed").tail(1), g.groupby("seed").tail(k)
    if "flagged" in g and not tail["flagged"].all():
        tail = tail[~tail["flagged"]]
        last = last[~last["flagged"]] if not last["flagged"].all() else last
    return _End(
        x=float(last[x].mean()),
        observed=float(last[MEAN_AT_16].mean()),
        x_tail=tail[x].to_numpy(float),  # every seed's last k: their mean is the mean of the seeds' means
        observed_k=float(tail.groupby("seed")[MEAN_AT_16].mean().mean()),
        window=int(tail.groupby("seed").size().min()),  # fewer than k where a seed has fewer evaluations
        seeds=int(tail["seed"].nunique()),
    )


def _predicted_end(f: CurveFit, fc: Forecast, end: _End, k: int) -> dict[str, Any]:
    """The early fit's predictions of the end, their errors, and the bands for the seeds' mean (of one
    evaluation, and of the last k where the model has a noise estimate for them) with z."""
    pred = float(f.predict(np.array([end.x]))[0])
    pred_k = float(f.predict(end.x_tail).mean())
    a_half = f.params.get(f.parameters.asymptote, np.nan)  # the ceiling (the power law's A) fitted on half
    cells: dict[str, Any] = dict(A_half=a_half, predicted=pred, error=pred - end.observed)
    cells[f"predicted_last{k}"] = pred_k
    cells[f"error_last{k}"] = pred_k - end.observed_k
    lo, hi = fc.target_band([end.x], end.seeds)
    sd = fc.expected_error_at([end.x], end.seeds)
    lo_k, hi_k, sd_k, lift_k = np.nan, np.nan, np.nan, np.nan  # no noise estimate for a window this short: no band
    if end.window in fc.mean_windows:
        lo_k, hi_k = fc.target_band(end.x_tail, end.seeds, window=end.window)
        sd_k = fc.expected_error_at(end.x_tail, end.seeds, end.window)
        lift_k = float(fc.open_rise(end.x_tail).mean())  # how far an open ceiling lifted the band's top
    cells.update(band_lo=lo, band_hi=hi, in_band=bool(lo <= end.observed <= hi), z=(pred - end.observed) / sd)
    cells.update(
        {
            f"band_last{k}_lo": lo_k,
            f"band_last{k}_hi": hi_k,
            f"in_band_last{k}": bool(lo_k <= end.observed_k <= hi_k),
            f"z_last{k}": cells[f"error_last{k}"] / sd_k,
            f"expected_error_last{k}": sd_k,
            f"open_rise_last{k}": lift_k,
        }
    )
    return cells

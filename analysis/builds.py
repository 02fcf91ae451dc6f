"""The base-model build as a factor: which builds (weights, ``runners.task.weights``) a campaign's runs
started from, and, where there are several, each variant's level by build with the between-build
spread beside the seeds' own, and each difference from the baseline by build with its between-build
heterogeneity. A level is a run's last-3 mean of mean@16 (its last three evaluations), averaged over
a build's seeds.

Builds differ far more than seeds do (GPU builds of one key: results/builds-gpu), so runs of several
builds are never pooled silently: ``analysis fit`` says so (``mixed``) and writes ``builds.md``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from runners.contract import MEAN_AT_16
from scalefit import FitError, fit_sigmoid
from scalefit.forecasts.settings import FitSettings

BUILD = "build"  # curves.csv's column: the first 12 hex digits of the run's base weights' sha256 ("" unknown)
LAST_K = 3


def run_levels(curves: pd.DataFrame) -> pd.DataFrame:
    """A row per run: variant, build, seed and its last-3 mean of mean@16."""
    build = curves[BUILD].fillna("").astype(str) if BUILD in curves else pd.Series("", index=curves.index)
    frame = curves.assign(**{BUILD: build}).sort_values("step")
    last = frame.groupby(["variant", BUILD, "seed"], sort=False)[MEAN_AT_16].apply(lambda s: s.tail(LAST_K).mean())
    return last.rename("level").reset_index()


def builds(curves: pd.DataFrame) -> list[str]:
    """The builds the runs started from, most runs first ("" for runs that recorded none)."""
    levels = run_levels(curves)
    return list(levels[BUILD].value_counts().index)


def mixed(curves: pd.DataFrame) -> str | None:
    """One line when the runs started from more than one build (naming each and its runs), else None."""
    levels = run_levels(curves)
    counts = levels[BUILD].value_counts()
    if len(counts) < 2:
        return None
    listed = ", ".join(f"{b or 'unrecorded'}: {n} run(s)" for b, n in counts.items())
    return (
        f"the runs started from {len(counts)} base-model builds ({listed}); builds differ more than seeds, so "
        "levels and differences by build, with their between-build spread, are in builds.md (the fit pools them)"
    )


def build_asymptotes(curves: pd.DataFrame, settings: FitSettings) -> pd.Series:
    """Each (variant, build)'s fitted asymptote A: the sigmoid fitted to that build's seeds alone
    (R0 their mean at the first evaluation), NaN where the fit fails."""
    out = {}
    build = curves[BUILD].fillna("").astype(str)
    for (variant, b), g in curves.assign(**{BUILD: build}).groupby(["variant", BUILD], sort=False):
        r0 = float(g.loc[g["step"] == g["step"].min(), MEAN_AT_16].mean())
        try:
            fit = fit_sigmoid(g[settings.x], g[MEAN_AT_16], r0=r0, a_grid=settings.a_values, runs=g["seed"])
            out[(variant, b)] = float(fit.A)
        except FitError:
            out[(variant, b)] = np.nan
    return pd.Series(out, dtype=float)


def by_build(curves: pd.DataFrame, baseline: str = "baseline", settings: FitSettings | None = None) -> pd.DataFrame:
    """A row per variant: its builds, level (mean over builds of each build's seed mean), the
    between-build sd of that level and the within-build (seed) sd; with ``settings``, the mean of its
    builds' asymptotes A (each build fitted alone) and their between-build sd; and, beside a baseline,
    the difference from it (mean over builds of each build's own difference), its between-build sd
    (heterogeneity) and its standard error across builds."""
    levels = run_levels(curves)
    asymptotes = build_asymptotes(curves, settings) if settings is not None else None
    cell = levels.groupby(["variant", BUILD])["level"].agg(["mean", "count"]).reset_index()
    within = levels.groupby(["variant", BUILD])["level"].std(ddof=1)
    base = cell[cell["variant"] == baseline].set_index(BUILD)["mean"]
    rows = []
    for variant, g in cell.groupby("variant", sort=False):
        means = g.set_index(BUILD)["mean"]
        row = {
            "variant": variant,
            "builds": len(means),
            "runs": int(g["count"].sum()),
            "level": float(means.mean()),
            "between_build_sd": float(means.std(ddof=1)) if len(means) > 1 else np.nan,
            "within_build_sd": float(np.sqrt(np.nanmean(within.loc[variant] ** 2)))
            if within.loc[variant].notna().any()
            else np.nan,
        }
        if asymptotes is not None:
            a = asymptotes.loc[variant].dropna()
            row |= {"A": float(a.mean()) if len(a) else np.nan, "A_between_build_sd": float(a.std(ddof=1))}
        if variant != baseline and len(base):
            delta = (means - base).dropna()  # each build's difference from its own baseline
            row |= {
                "delta": float(delta.mean()) if len(delta) else np.nan,
                "delta_between_build_sd": float(delta.std(ddof=1)) if len(delta) > 1 else np.nan,
                "delta_se": float(delta.std(ddof=1) / np.sqrt(len(delta))) if len(delta) > 1 else np.nan,
                "paired_builds": len(delta),
            }
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(curves: pd.DataFrame, baseline: str = "baseline", settings: FitSettings | None = None) -> str:
    """``builds.md``: the builds and their runs, then each variant's level (and, with ``settings``, A)
    and difference by build."""
    levels = run_levels(curves)
    table = by_build(curves, baseline, settings)

    def f(v: float, sign: bool = False) -> str:
        return "" if pd.isna(v) else (f"{v:+.3f}" if sign else f"{v:.3f}")

    lines = ["# Base-model builds", "", "| build | runs | variants |", "|---|---|---|"]
    for b, g in levels.groupby(BUILD, sort=False):
        lines.append(f"| {b or 'unrecorded'} | {len(g)} | {', '.join(sorted(g['variant'].unique()))} |")
    lines += [
        "",
        "Level: a run's last-3 mean of mean@16, averaged over a build's seeds, then over builds. Δ: each build's",
        "difference from its own baseline, averaged over builds; its sd across builds is the effect's build",
        "heterogeneity, and its se (sd / √builds) the uncertainty a claim about another build carries.",
        "A: each build's seeds fitted alone (R0 their first evaluation's mean), the mean over builds and its sd.",
        "",
        "| variant | builds | runs | level | sd between builds | sd within (seeds) | A | A sd between builds | Δ "
        "| Δ sd between builds | Δ se |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.to_dict("records"):
        lines.append(
            f"| {r['variant']} | {r['builds']} | {r['runs']} | {f(r['level'])} | {f(r['between_build_sd'])} | "
            f"{f(r['within_build_sd'])} | {f(r.get('A', np.nan))} | {f(r.get('A_between_build_sd', np.nan))} | "
            f"{f(r.get('delta', np.nan), True)} | "
            f"{f(r.get('delta_between_build_sd', np.nan))} | {f(r.get('delta_se', np.nan))} |"
        )
    return "\n".join(lines) + "\n"


def column(curves: pd.DataFrame) -> pd.DataFrame | None:
    """The LOO table's ``builds`` column: per variant the builds its runs started from (";"-joined),
    or None where the curves record no build (studies recorded before builds were)."""
    if BUILD not in curves or not curves[BUILD].fillna("").astype(bool).any():
        return None
    levels = run_levels(curves)
    named = levels[BUILD].replace("", "unrecorded")
    out = named.groupby(levels["variant"]).agg(lambda s: ";".join(sorted(s.unique()))).rename("builds").reset_index()
    if levels[BUILD].nunique() < 2:
        return out
    spread = by_build(curves).drop(columns=["builds", "runs", "level", "within_build_sd"], errors="ignore")
    spread = spread.drop(columns=["delta", "delta_se", "paired_builds"], errors="ignore")
    return out.merge(spread, on="variant", how="left")  # level_ and delta_ between-build sd beside the builds


def line(table: pd.DataFrame) -> str | None:
    """One line for the table's header and the terminal summary: the build every run started from,
    or how many builds there are and where their spread is; None where no build is recorded."""
    if "builds" not in table:
        return None
    ids = sorted({b for cell in table["builds"].dropna() for b in str(cell).split(";") if b})
    if len(ids) == 1:
        return f"base model: build {ids[0]} (every run)"
    base = table.loc[table["variant"] == "baseline", "between_build_sd"] if "between_build_sd" in table else []
    sd = f"; the baseline's level sd {base.iloc[0]:.3f} between them" if len(base) and pd.notna(base.iloc[0]) else ""
    return f"base models: {len(ids)} builds ({', '.join(ids)}){sd}; each variant by build: builds.md"

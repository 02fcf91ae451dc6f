"""Did each axis act, through the mechanism the paper names? The per-variant means of the
training metrics that show each mechanism at work, beside the baseline's, from MLflow."""

from __future__ import annotations

import numpy as np
import pandas as pd
from mlflow.tracking import MlflowClient

from runners.recipe import Recipe

# column → (metric logged by the trainer, how a run's history is reduced, what it shows)
MECHANISMS: dict[str, tuple[str, str, str]] = {
    "staleness": (
        "train/off_policy/staleness",
        "mean",
        "optimizer steps between generating a batch and training on it",
    ),
    "clipped (DAPO/GSPO)": ("train/clip_ratio/region_mean", "mean", "share of tokens whose ratio was clipped"),
    "clipped (CISPO)": ("train/cispo_clip_ratio", "mean", "share of tokens whose importance weight was truncated"),
    "logp mismatch": (
        "train/sampling/sampling_logp_difference/mean",
        "mean",
        "mean |log p generator − log p trainer| of the same sampled tokens",
    ),
    "NPR dropped": ("train/npr/dropped_prompts", "last", "prompts retired by No-Positive-Resampling by the end"),
    "zero-variance groups": (
        "train/filter/zero_variance_frac",
        "mean",
        "share of prompts whose rewards were all equal",
    ),
    "prompts in the loss": ("train/filter/effective_prompts", "mean", "prompts per step left after filtering"),
    "interrupted": ("train/length/interruption_rate", "mean", "share of completions cut at the thinking budget"),
    "length penalty": (
        "train/rewards/soft_overlong_punishment_reward/mean",
        "mean",
        "mean DAPO overlong penalty per completion",
    ),
}
# the columns that show each recipe setting acting, by the recipe key a variant changes (whatever its
# campaign calls the axis); settings with none act by construction (tests/test_axes.py)
KEY_COLUMNS: dict[str, tuple[str, ...]] = {
    "algorithm.loss": ("clipped (DAPO/GSPO)", "clipped (CISPO)"),
    "algorithm.off_policy": ("staleness",),
    "algorithm.fp32_lm_head": ("logp mismatch",),
    "algorithm.sampling": ("NPR dropped",),
    "algorithm.zero_variance_filter": ("prompts in the loss",),
    "length.control": ("interrupted", "length penalty"),
    "algorithm.aggregation": (),
    "algorithm.advantage_norm": (),
}
NOT_SETTINGS = ("name", "train.seed")  # recipe params that differ between runs of one setting
# A recipe key a run did not log (an option newer than the run, or a loss's setting: runners.losses)
# it ran at its default: compared as that, so a new option alone makes no variant a control.
DEFAULTS = {k: str(v) for k, v in Recipe().flat().items()}
RELATIVE = 0.05  # a mechanism metric this far from the baseline's (relative) counts as acting


def _reduce(values: list[float], how: str) -> float:
    return float(np.mean(values) if how == "mean" else values[-1]) if values else np.nan


def mechanism_runs(curves: pd.DataFrame, client: MlflowClient) -> pd.DataFrame:
    """One row per run: the recipe keys its variant changes against the baseline (from the recipe
    each run logged as params), and each mechanism metric reduced over the run (NaN: never logged)."""
    runs = curves.groupby("run_id")[["variant", "axis"]].first().reset_index()
    params = {r.run_id: client.get_run(r.run_id).data.params for r in runs.itertuples()}
    base_ids = runs.loc[runs["variant"] == "baseline", "run_id"]
    base = params[base_ids.iloc[0]] if len(base_ids) else {}
    rows = []
    for r in runs.itertuples():
        mine = params[r.run_id]
        changed = {
            k
            for k in set(mine) | set(base)
            if k not in NOT_SETTINGS and mine.get(k, DEFAULTS.get(k)) != base.get(k, DEFAULTS.get(k))
        }
        row = {
            "variant": r.variant,
            "axis": r.axis if isinstance(r.axis, str) else "",
            "keys": frozenset(changed),
            "recipe logged": bool(mine) and bool(base),  # without both recipes, what it changes is unknown
        }
        for col, (metric, how, _) in MECHANISMS.items():
            history = sorted(client.get_metric_history(r.run_id, metric), key=lambda m: m.step)
            row[col] = _reduce([m.value for m in history], how)
        rows.append(row)
    return pd.DataFrame(rows)


def acted(runs: pd.DataFrame, identical: set[str] | frozenset[str] = frozenset()) -> pd.DataFrame:
    """Per variant, the seed mean of each mechanism metric and ``acted``: which metrics of the recipe
    setting it changes (``KEY_COLUMNS``, by recipe key, whatever the campaign names the axis) left
    the baseline's range over seeds (and by more than ``RELATIVE``), or appeared or vanished with a
    non-zero value (a mechanism switched on or off; one logged as 0 never fired). A variant that
    changes another setting, or several, is a control. Variants in ``identical`` (mean@16 equal to
    the baseline's at every step) did not act, whatever their metrics show (e.g. prompts retired by
    No-Positive-Resampling that were never redrawn)."""
    groups = dict(tuple(runs.groupby("variant", sort=False)))
    base = groups.get("baseline")
    rows = []
    for variant in sorted(groups, key=lambda v: v != "baseline"):
        g = groups[variant]
        row = {"variant": variant, "axis": g["axis"].iloc[0], **g[list(MECHANISMS)].mean().to_dict()}
        keys = g["keys"].iloc[0]
        # a variant of one known setting is judged by that setting's columns; anything else is a control
        cols = KEY_COLUMNS.get(next(iter(keys))) if len(keys) == 1 else None
        if variant == "baseline" or base is None:
            row["acted"] = ""
        elif not (g["recipe logged"].all() and base["recipe logged"].all()):
            row["acted"] = (
                "unknown: a run of this variant or of the baseline logged no recipe params, so which"
                " setting it changes cannot be read (runs from an older store or another tool)"
            )
        elif not keys:
            row["acted"] = "unknown: its recipe equals the baseline's (it changes no setting)"
        elif cols is None:
            row["acted"] = "control: see every column"
        elif variant in identical:
            row["acted"] = "did not act: mean@16 identical to the baseline's at every step"
        elif not cols:
            row["acted"] = "no mechanism metric; acts by construction (tests/test_axes.py)"
        else:
            moved = [f"{c} {_fmt(base[c].mean())} → {_fmt(row[c])}" for c in cols if _moved(base[c], g[c])]
            row["acted"] = (
                "acted: " + "; ".join(moved)
                if moved
                else "did not act: " + ", ".join(cols) + " within the baseline's seeds"
            )
        rows.append(row)
    return pd.DataFrame(rows)


def _fmt(v: float) -> str:
    return "—" if np.isnan(v) else f"{v:.3g}"


def _moved(base: pd.Series, variant: pd.Series) -> bool:
    if base.isna().all() or variant.isna().all():  # logged in one only: switched on or off, if it ever fired
        logged = variant if base.isna().all() else base
        return not logged.isna().all() and bool(np.nanmax(np.abs(logged)) > 0)
    lo, hi, v = base.min(), base.max(), variant.mean()
    apart = variant.min() > hi or variant.max() < lo
    return bool(apart and abs(v - base.mean()) > RELATIVE * max(abs(v), abs(base.mean())))


def to_markdown(table: pd.DataFrame) -> str:
    cols = list(MECHANISMS)
    lines = [
        "| variant | " + " | ".join(cols) + " | acted? |",
        "|---|" + "---|" * (len(cols) + 1),
    ]
    for _, row in table.iterrows():
        cells = [_fmt(row[c]) for c in cols]
        lines.append(f"| {row['variant']} | " + " | ".join(cells) + f" | {row['acted']} |")
    notes = [f"- **{c}**: {desc} (`{metric}`, {how} over the run)" for c, (metric, how, desc) in MECHANISMS.items()]
    return "\n".join(lines + ["", *notes]) + "\n"

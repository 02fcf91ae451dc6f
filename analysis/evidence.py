"""Did each axis act, through the mechanism the paper names? The per-variant means of the
training metrics that show each mechanism at work, beside the baseline's, from MLflow."""

from __future__ import annotations

import numpy as np
import pandas as pd
from mlflow.tracking import MlflowClient

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
# the columns that show each LOO axis acting; axes with none act by construction (tests/test_axes.py)
AXIS_COLUMNS: dict[str, tuple[str, ...]] = {
    "loss": ("clipped (DAPO/GSPO)", "clipped (CISPO)"),
    "off_policy": ("staleness",),
    "fp32": ("logp mismatch",),
    "sampling": ("NPR dropped",),
    "zero_variance": ("prompts in the loss",),
    "length": ("interrupted", "length penalty"),
    "aggregation": (),
    "advantage": (),
}
RELATIVE = 0.05  # a mechanism metric this far from the baseline's (relative) counts as acting


def _reduce(values: list[float], how: str) -> float:
    return float(np.mean(values) if how == "mean" else values[-1]) if values else np.nan


def mechanism_runs(curves: pd.DataFrame, client: MlflowClient) -> pd.DataFrame:
    """One row per run: each mechanism metric reduced over the run (NaN: never logged)."""
    runs = curves.groupby("run_id")[["variant", "axis"]].first().reset_index()
    rows = []
    for r in runs.itertuples():
        row = {"variant": r.variant, "axis": r.axis if isinstance(r.axis, str) else ""}
        for col, (metric, how, _) in MECHANISMS.items():
            history = sorted(client.get_metric_history(r.run_id, metric), key=lambda m: m.step)
            row[col] = _reduce([m.value for m in history], how)
        rows.append(row)
    return pd.DataFrame(rows)


def acted(runs: pd.DataFrame, identical: set[str] | frozenset[str] = frozenset()) -> pd.DataFrame:
    """Per variant, the seed mean of each mechanism metric and ``acted``: which of the axis's own
    metrics left the baseline's range over seeds (and by more than ``RELATIVE``), or appeared or
    vanished with a non-zero value (a mechanism switched on or off; one logged as 0 never fired).
    Variants in ``identical`` (mean@16 equal to the baseline's at every step) did not act, whatever
    their metrics show (e.g. prompts retired by No-Positive-Resampling that were never redrawn)."""
    groups = dict(tuple(runs.groupby("variant", sort=False)))
    base = groups.get("baseline")
    rows = []
    for variant in sorted(groups, key=lambda v: v != "baseline"):
        g = groups[variant]
        row = {"variant": variant, "axis": g["axis"].iloc[0], **g[list(MECHANISMS)].mean().to_dict()}
        cols = AXIS_COLUMNS.get(row["axis"])
        if variant == "baseline" or base is None:
            row["acted"] = ""
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

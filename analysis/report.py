"""A written report of one run, from its MLflow data: overview, plots, time and memory profile,
and anomalies with the numbers behind them.

``summarize_run`` computes what a report says, ``render_plots`` / ``render_markdown`` format it,
and ``write_run_report(run)`` does all three, writing ``report.md`` and PNG plots to a folder and
logging them to the run under ``report/``. ``analysis fit`` writes one per finished run of a
campaign that has none; ``make report RUN=<id or name>`` any time.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from runners.contract import COMPUTE_METRICS, MEAN_AT_16, PASS_AT_16
from runners.tracking import store

TRUNCATION_LIMIT = 0.10  # the paper's instability signal: more than 10% of completions hit the length limit
ENTROPY_COLLAPSE = 0.10  # entropy below 10% of its starting level
SPIKE_MADS = 5.0  # a reward point this many robust deviations from its neighbourhood is a dip or spike
SPIKE_MIN = 0.15  # ... and at least this far in absolute terms
REGRESSION_MIN = 0.05  # validation drop from the running best worth reporting

KEY_SETTINGS = (
    "model.size",
    "model.path",
    "model.dtype",
    "algorithm.loss",
    "algorithm.fp32_lm_head",
    "algorithm.aggregation",
    "algorithm.advantage_norm",
    "algorithm.zero_variance_filter",
    "algorithm.sampling",
    "algorithm.off_policy",
    "algorithm.off_policy_k",
    "algorithm.pipeline_lag",
    "length.control",
    "batch.prompts",
    "batch.generations",
    "optim.lr",
    "train.steps",
    "train.seed",
    "eval.prompts",
    "eval.samples",
)
PHASES = ("generation", "reward", "update", "evaluation")


@dataclass
class Finding:
    kind: str
    text: str


def resolve_run(client: MlflowClient, ref: str, experiment: str | None = None) -> Run:
    """A run by id, by name (``baseline/seed0``) within one experiment or all of them, or
    ``latest``: the newest run that carries an identity."""
    if re.fullmatch(r"[0-9a-f]{32}", ref):
        return client.get_run(ref)
    if ref == "latest":
        exps = [client.get_experiment_by_name(experiment)] if experiment else client.search_experiments()
        ids = [e.experiment_id for e in exps if e is not None]
        newest = (
            client.search_runs(
                ids, f"tags.`{store.RUN_ID}` != ''", max_results=1, order_by=["attributes.start_time DESC"]
            )
            if ids
            else []
        )
        if not newest:
            raise ValueError(f"no runs in {experiment or 'any experiment'} at {client.tracking_uri}")
        return newest[0]
    exps = [client.get_experiment_by_name(experiment)] if experiment else client.search_experiments()
    if experiment and exps[0] is None:
        raise ValueError(f"no experiment named {experiment!r} at {client.tracking_uri}")
    ids = [e.experiment_id for e in exps if e is not None]
    runs = (
        client.search_runs(
            ids, filter_string=f"attributes.run_name = '{ref}'", max_results=50, order_by=["attributes.start_time DESC"]
        )
        if ids
        else []
    )
    if not runs:
        raise ValueError(f"no run with id or name {ref!r} at {client.tracking_uri}" + _known_names(client, ids, ref))
    if len({r.info.experiment_id for r in runs}) == 1:
        return runs[0]  # the same name in one campaign (an earlier identity of the run): the newest
    if len(runs) > 1:
        where = ", ".join(f"{r.info.run_id} ({client.get_experiment(r.info.experiment_id).name})" for r in runs)
        raise ValueError(f"{len(runs)} runs are named {ref!r}: {where}; pass a run id or --experiment")
    return runs[0]


def _known_names(client: MlflowClient, exp_ids: list[str], ref: str, shown: int = 30) -> str:
    """What to pass instead of ``ref``: the names of the runs there are (the closest first), or that
    there are none."""
    import difflib

    found = client.search_runs(exp_ids, f"tags.`{store.RUN_ID}` != ''", max_results=5000) if exp_ids else []
    names = sorted({r.info.run_name for r in found})
    if not names:
        return "; it holds no runs yet"
    close = [n for n in names if n.startswith(f"{ref}/")] or difflib.get_close_matches(ref, names, n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(close[:3])}?" if close else ""
    rest = f" … and {len(names) - shown} more" if len(names) > shown else ""
    return f"{hint} Runs there: {', '.join(names[:shown])}{rest}"


def histories(client: MlflowClient, run: Run) -> dict[str, pd.Series]:
    out = {}
    for key in run.data.metrics:
        if key.startswith("system/"):
            continue
        out[key] = store.history(client, run.info.run_id, key)
    return out


# --- anomaly detection -------------------------------------------------------------------


def _ranges(steps: list[int]) -> str:
    """[3, 4, 5, 9] → '3–5, 9'."""
    out, start, prev = [], None, None
    for s in steps:
        if start is None:
            start = prev = s
        elif s == prev + 1:
            prev = s
        else:
            out.append(f"{start}–{prev}" if prev != start else f"{start}")
            start = prev = s
    if start is not None:
        out.append(f"{start}–{prev}" if prev != start else f"{start}")
    return ", ".join(out)


def reward_spikes(reward: pd.Series, window: int = 9) -> list[Finding]:
    """Points far from the rolling median of their neighbourhood (robust: median absolute deviation)."""
    if len(reward) < window:
        return []
    med = reward.rolling(window, center=True, min_periods=3).median()
    dev = (reward - med).abs()
    mad = dev.rolling(window, center=True, min_periods=3).median().clip(lower=1e-3)
    found = []
    for step in reward.index[(dev > SPIKE_MADS * 1.4826 * mad) & (dev > SPIKE_MIN)]:
        kind = "dip" if reward[step] < med[step] else "spike"
        found.append(Finding(f"reward {kind}", f"step {step}: reward {reward[step]:.3f} vs {med[step]:.3f} around it"))
    return found


def truncation(clipped: pd.Series) -> list[Finding]:
    high = clipped[clipped > TRUNCATION_LIMIT]
    if high.empty:
        return []
    return [
        Finding(
            "truncation",
            f"{len(high)} step(s) with more than {TRUNCATION_LIMIT:.0%} of completions truncated at the length "
            f"limit (max {high.max():.0%} at step {high.idxmax()}; steps {_ranges(list(high.index))}): "
            "the paper's early sign of instability",
        )
    ]


def entropy_collapse(entropy: pd.Series) -> list[Finding]:
    if len(entropy) < 5:
        return []
    start = float(entropy.iloc[:5].median())
    low = entropy[entropy < ENTROPY_COLLAPSE * start]
    if start <= 0 or low.empty:
        return []
    return [
        Finding(
            "entropy collapse",
            f"entropy fell below {ENTROPY_COLLAPSE:.0%} of its start ({start:.3f}) at step {low.index[0]} "
            f"(lowest {entropy.min():.4f} at step {entropy.idxmin()}): sampling has become near-greedy",
        )
    ]


def validation_regressions(val: pd.Series, n_prompts: int = 0) -> list[Finding]:
    found, best, best_step = [], -math.inf, None
    for step, v in val.items():
        # a drop beyond sampling noise: max(REGRESSION_MIN, 3 standard errors of a mean over prompts)
        noise = 3 * math.sqrt(max(best, 0) * (1 - max(best, 0)) / n_prompts) if n_prompts else 0.0
        if best_step is not None and best - v > max(REGRESSION_MIN, noise):
            found.append(
                Finding(
                    "validation regression",
                    f"step {step}: mean@16 {v:.3f}, {best - v:.3f} below the best so far "
                    f"({best:.3f} at step {best_step})",
                )
            )
        if v > best:
            best, best_step = v, step
    return found


def nonfinite(h: dict[str, pd.Series]) -> list[Finding]:
    found = []
    for key, s in h.items():
        bad = s[~np.isfinite(s.to_numpy())]
        if not bad.empty:
            found.append(Finding("NaN/inf", f"{key} non-finite at steps {_ranges(list(bad.index))}"))
    counted = h.get("train/nonfinite_values")
    if counted is not None and (counted > 0).any():
        steps = list(counted.index[counted > 0])
        found.append(
            Finding("NaN/inf", f"the trainer logged non-finite values (e.g. grad_norm) at steps {_ranges(steps)}")
        )
    return found


def find_anomalies(h: dict[str, pd.Series], n_val_prompts: int = 0) -> list[Finding]:
    found: list[Finding] = []
    if "train/reward" in h:
        found += reward_spikes(h["train/reward"])
    if "train/completions/clipped_ratio" in h:
        found += truncation(h["train/completions/clipped_ratio"])
    if "train/entropy" in h:
        found += entropy_collapse(h["train/entropy"])
    if MEAN_AT_16 in h:
        found += validation_regressions(h[MEAN_AT_16], n_val_prompts)
    found += nonfinite(h)
    for key in COMPUTE_METRICS:
        if key in h:
            found += compute_backwards(h[key], key)
    return found


def compute_backwards(compute: pd.Series, key: str) -> list[Finding]:
    """Compute spent so far can only grow with the step; a drop means two runs were spliced into one."""
    s = compute.sort_index()
    drops = s.index[1:][np.diff(s.to_numpy()) < 0]
    if not len(drops):
        return []
    step = drops[0]
    prev = s.index[s.index.get_loc(step) - 1]
    return [
        Finding(
            "compute goes backwards",
            f"{key} {s[prev]:.4g} at step {prev}, then {s[step]:.4g} at step {step}: this history holds two runs "
            "spliced together (a restart into an existing run); its curve cannot be fitted",
        )
    ]


# --- plots and the report ----------------------------------------------------------------


def _plot(path: Path, title: str, series: dict[str, pd.Series], xlabel: str = "step", ylabel: str = "") -> bool:
    import matplotlib.pyplot as plt

    series = {k: v for k, v in series.items() if v is not None and len(v)}
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for label, s in series.items():
        ax.plot(s.index, s.to_numpy(), label=label, marker="o" if len(s) < 30 else None, ms=3)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _against(h: dict[str, pd.Series], y: str, x: str) -> pd.Series | None:
    if y not in h or x not in h:
        return None
    df = pd.concat([h[x].rename("x"), h[y].rename("y")], axis=1).dropna()
    return pd.Series(df["y"].to_numpy(), index=df["x"].to_numpy())


@dataclass
class RunSummary:
    """Everything a run's report says, computed once from MLflow; rendering only formats it."""

    name: str
    run_id: str
    experiment: str
    status: str
    settings: dict[str, str]
    h: dict[str, pd.Series]  # metric histories by step (system metrics left out)
    per_step: dict[str, float]  # seconds per training step by phase (evaluation amortised)
    peaks: dict[str, float]  # GiB
    findings: list[Finding]


def summarize_run(client: MlflowClient, run: Run) -> RunSummary:
    h = histories(client, run)
    p = run.data.params
    steps = max(1.0, float(max((s.index.max() for s in h.values() if len(s)), default=1)))
    per_step = {ph: float(h[f"train/time/{ph}_seconds"].mean()) for ph in PHASES[:3] if f"train/time/{ph}_seconds" in h}
    if "val/seconds" in h:
        per_step["evaluation"] = float(h["val/seconds"].sum()) / steps
    return RunSummary(
        name=run.info.run_name or run.info.run_id,
        run_id=run.info.run_id,
        experiment=client.get_experiment(run.info.experiment_id).name,
        status=run.info.status,
        settings={k: p[k] for k in KEY_SETTINGS if k in p and p[k] not in ("None", "")},
        h=h,
        per_step=per_step,
        peaks={k.split("memory/")[1]: float(h[k].max()) for k in h if "memory/" in k},
        findings=find_anomalies(h, int(p.get("eval.prompts", 0) or 0)),
    )


def render_plots(r: RunSummary, out: Path) -> list[str]:
    """The report's PNGs under ``out``; returns the names of those written (series that exist)."""
    h, g = r.h, r.h.get
    clipped = g("train/completions/clipped_ratio")
    plots = {
        "reward.png": (
            "Reward: mean and within-group std",
            {"reward": g("train/reward"), "std": g("train/reward_std")},
        ),
        "zero_std.png": (
            "Prompts whose completions all scored the same",
            {"fraction of groups": g("train/frac_reward_zero_std"), "filtered": g("train/filter/zero_variance_frac")},
        ),
        "loss_entropy.png": ("Loss and entropy", {"loss": g("train/loss"), "entropy": g("train/entropy")}),
        "clipping.png": (
            "Clip ratios",
            {k.removeprefix("train/"): v for k, v in h.items() if "clip_ratio" in k and "completions" not in k},
        ),
        "lengths.png": (
            "Completion length (tokens) and truncation",
            {
                "mean": g("train/completions/mean_length"),
                "max": g("train/completions/max_length"),
                "truncated x 100": None if clipped is None else 100 * clipped,
            },
        ),
        "tokens.png": (
            "Tokens processed (cumulative)",
            {"tokens": g("compute/tokens"), "TRL num_tokens": g("train/num_tokens")},
        ),
    }
    written = [f for f, (title, series) in plots.items() if _plot(out / f, title, series)]
    x = "compute/gpu_hours"
    if _plot(
        out / "validation.png",
        "Validation against compute",
        {"mean@16": _against(h, MEAN_AT_16, x), "pass@16": _against(h, PASS_AT_16, x)},
        xlabel=x,
    ):
        written.insert(0, "validation.png")
    if r.per_step:
        _time_profile(out / "time_profile.png", r.per_step)
        written.append("time_profile.png")
    mem_keys = sorted(k for k in h if k.startswith(("train/memory/", "memory/")) and "peak" not in k)
    if _plot(out / "memory.png", "Memory by phase (GiB)", {k.split("memory/")[1]: h[k] for k in mem_keys}):
        written.append("memory.png")
    return written


def _time_profile(path: Path, per_step: dict[str, float]) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 1.8))
    left = 0.0
    for ph, secs in per_step.items():
        ax.barh([0], [secs], left=left, label=f"{ph} {secs:.2f}s")
        left += secs
    ax.set(yticks=[], xlabel="seconds per training step", title="Time profile of a step")
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.45))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def render_markdown(r: RunSummary, plots: list[str]) -> str:
    h = r.h
    md = [f"# Run report: {r.name}", "", f"Run `{r.run_id}` in experiment `{r.experiment}`, status {r.status}."]
    md += ["", "## Overview", "", "| setting | value |", "|---|---|"]
    md += [f"| {k} | {v} |" for k, v in r.settings.items()]
    val = h.get(MEAN_AT_16)
    if val is not None and len(val):
        md += ["", "## Results", ""]
        md.append(
            f"- validation mean@16: {val.iloc[0]:.3f} at step {val.index[0]} → {val.iloc[-1]:.3f} at step "
            f"{val.index[-1]} (best {val.max():.3f} at step {val.idxmax()})"
        )
        if PASS_AT_16 in h:
            md.append(f"- pass@16: {h[PASS_AT_16].iloc[0]:.3f} → {h[PASS_AT_16].iloc[-1]:.3f}")
    for key, label, spec in (
        ("compute/gpu_hours", "device-hours of training", ".4f"),
        ("compute/samples", "completions generated", ",.0f"),
        ("compute/tokens", "tokens processed", ",.0f"),
    ):
        if key in h and len(h[key]):
            md.append(f"- {label}: {format(h[key].iloc[-1], spec)}")
    md += ["", "## Anomalies", ""]
    md += [f"- **{f.kind}**: {f.text}" for f in r.findings] or [
        "None found (reward dips/spikes, truncation > 10%, entropy collapse, validation regressions, NaN/inf)."
    ]
    if r.per_step:
        total = sum(r.per_step.values())
        md += ["", "## Time per training step", "", "| phase | seconds | share |", "|---|---|---|"]
        md += [f"| {ph} | {s:.3f} | {s / total:.0%} |" for ph, s in r.per_step.items()]
        if "update" not in r.per_step:
            md += ["", "Training phases were not recorded (the run predates per-phase profiling)."]
    if r.peaks:
        md += ["", "## Peak memory (GiB)", "", "| measure | peak |", "|---|---|"]
        md += [f"| {k} | {v:.3f} |" for k, v in sorted(r.peaks.items())]
    md += ["", "## Plots", ""] + [f"![{f.removesuffix('.png')}]({f})" for f in plots]
    return "\n".join(md) + "\n"


def write_run_report(
    ref: str,
    out: Path | None = None,
    *,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    log_to_run: bool = True,
) -> Path:
    """Write ``report.md`` + PNGs for a run and log them to it under ``report/``; returns the Markdown path."""
    client = store.read_client(tracking_uri)
    summary = summarize_run(client, resolve_run(client, ref, experiment))
    out = out or Path("artifacts/reports") / re.sub(r"[^A-Za-z0-9_.=-]+", "-", f"{summary.name}-{summary.run_id[:8]}")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.md"
    path.write_text(render_markdown(summary, render_plots(summary, out)))
    if log_to_run:
        client.log_artifacts(summary.run_id, str(out), "report")
        client.set_tag(summary.run_id, store.REPORT, "report/report.md")
    return path

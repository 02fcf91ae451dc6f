"""Would an adaptive campaign have stopped the right variants, and how much would it have saved?

Replays the decisions of ``runners.campaign.adaptive.decide_at`` offline on recorded campaigns, using at
each decision point only the points up to it, and checks each stop against the full run:

- synthetic campaigns with known truth (a baseline and variants whose asymptote, efficiency or
  midpoint differ by known amounts; realistic evaluation noise, drift and seed offsets);
- the real campaigns in ``results/*/curves.csv`` (their recorded full curves).

A stop is **right** when the variant's observed final value (mean over its seeds' last
evaluations) is below the baseline's minus the margin; for synthetic campaigns also when its
true final value is. Saved compute is the completions a stopped variant's runs would still have
generated, as a share of the whole campaign (baseline included). The ceiling beside it is what a
rule that knew the outcome would save — every worse variant stopped at the first decision point,
nothing else — so a target above it cannot be met on that data without wrong stops.

Decisions follow ``--pooling`` as a campaign's ``fit.pooling`` does: ``partial`` (the default) fits
the campaign's variants jointly at each point, ``none`` each variant alone.

    python -m tests.bench_adaptive [--synthetic N] [--at 0.25 0.5] [--risk 0.05] [--pooling none]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from runners.campaign.adaptive import decide_at
from runners.campaign.spec import Adaptive, X
from runners.contract import MEAN_AT_16
from scalefit.data.synthetic import realistic_runs
from scalefit.forecasts.settings import POOLING, FitSettings
from scalefit.models.curve import sigmoid

ROOT = Path(__file__).resolve().parent.parent
# (label, dA, B factor, C_mid factor): how a variant differs from its baseline
VARIANTS = [
    ("A-0.15", -0.15, 1.0, 1.0),
    ("A-0.08", -0.08, 1.0, 1.0),
    ("A-0.04", -0.04, 1.0, 1.0),
    ("A-0.01", -0.01, 1.0, 1.0),
    ("same", 0.0, 1.0, 1.0),
    ("A+0.03", 0.03, 1.0, 1.0),
    ("slower x2", 0.0, 1.0, 2.0),
    ("B x0.6", 0.0, 0.6, 1.0),
]


def synthetic_campaign(i: int, rng: np.random.Generator) -> tuple[pd.DataFrame, dict[str, float]]:
    """Curves (variant, seed, compute/samples, mean@16) and each variant's true final value."""
    A = float(rng.uniform(0.55, 0.8))
    B = float(rng.uniform(1.5, 2.5))
    c_mid = 10_000.0
    budget = c_mid * float(rng.uniform(3.0, 8.0))  # the half-way point past the knee, as a designed study
    noise = dict(
        R0=float(rng.uniform(0.25, 0.45)),
        c_max=budget,
        n_points=int(rng.choice([21, 41])),
        n_prompts=int(rng.choice([500, 1000])),
        drift_sd=float(rng.uniform(0.0, 0.015)),
        drift_phi=float(rng.uniform(0.5, 0.9)),
        seed_sd=float(rng.uniform(0.0, 0.01)),
    )
    frames, truth = [], {}
    for j, (label, da, bf, cf) in enumerate([("baseline", 0.0, 1.0, 1.0), *VARIANTS]):
        a, b, cm = min(A + da, 0.99), B * bf, c_mid * cf
        df = realistic_runs(cm, b, a, seeds=3 if label == "baseline" else 2, seed=i * 1000 + j, **noise)
        frames.append(df.assign(variant=label).rename(columns={"compute": X, "value": MEAN_AT_16}))
        truth[label] = float(sigmoid(np.array([budget]), a, b, cm, noise["R0"])[0])
    return pd.concat(frames, ignore_index=True), truth


def replay(curves: pd.DataFrame, cfg: Adaptive, truth: dict[str, float] | None = None) -> pd.DataFrame:
    """One row per variant: where (if anywhere) it would have been stopped, and whether rightly.

    Decision points in order, as a live campaign meets them: a variant stopped at one point ends
    there, so it has not reached the later ones and the joint model there leaves it out."""
    budgets = {v: float(g[X].max()) for v, g in curves.groupby("variant")}
    finals = {
        v: float(g.sort_values(X).groupby("seed")[MEAN_AT_16].last().mean()) for v, g in curves.groupby("variant")
    }
    planned = {v: budgets[v] * g["seed"].nunique() for v, g in curves.groupby("variant")}
    names = sorted(set(curves["variant"]) - {"baseline"})
    rows = {v: {"variant": v, "stopped_at": None, "reason": "", "probability": None, "fit_model": ""} for v in names}
    cache: dict = {}  # the fits at each point serve every variant decided there
    seen = curves
    for f in cfg.at:
        for variant in names:
            row = rows[variant]
            if row["stopped_at"]:
                continue
            d = decide_at(seen, variant, f, budgets, cfg, cache)
            row["reason"], row["probability"], row["fit_model"] = d.reason, d.probability, d.fit_model
            if d.stop:
                row.update(stopped_at=f, predicted=d.variant_final, baseline_predicted=d.baseline_final)
        stopped = seen["variant"].map(lambda v: rows[v]["stopped_at"] if v in rows else None)
        ended = stopped.notna() & (seen[X] > stopped.fillna(1.0) * seen["variant"].map(budgets) * (1 + 1e-9))
        seen = seen[~ended]  # a stopped variant's runs end at its stop
    for variant, row in rows.items():
        worse = finals[variant] < finals["baseline"] - cfg.margin
        row.update(final=finals[variant], baseline_final=finals["baseline"], worse_observed=worse)
        if truth is not None:
            row["worse_true"] = truth[variant] < truth["baseline"] - cfg.margin
        row["saved"] = (1 - row["stopped_at"]) * planned[variant] if row["stopped_at"] else 0.0
        row["saved_if_known"] = (1 - min(cfg.at)) * planned[variant] if worse else 0.0
    out = pd.DataFrame(list(rows.values()))
    out.attrs["planned"] = sum(planned.values())
    return out


def summarise(name: str, tables: list[pd.DataFrame], truth: bool) -> dict:
    t = pd.concat(tables, ignore_index=True)
    stops = t[t["stopped_at"].notna()]
    planned = sum(x.attrs["planned"] for x in tables)
    out = {
        "set": name,
        "campaigns": len(tables),
        "variants": len(t),
        "truly worse (observed)": int(t["worse_observed"].sum()),
        "stopped": len(stops),
        "wrong stops (observed)": int((~stops["worse_observed"]).sum()),
        "worse variants stopped": f"{int(stops['worse_observed'].sum())}/{int(t['worse_observed'].sum())}",
        "compute saved": f"{t['saved'].sum() / planned:.1%}",
        "ceiling (outcome known)": f"{t['saved_if_known'].sum() / planned:.1%}",
    }
    if truth:
        out["wrong stops (truth)"] = int((~stops["worse_true"]).sum())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--synthetic", type=int, default=12, help="synthetic campaigns (default 12, 8 variants each)")
    p.add_argument("--at", type=float, nargs="+", default=[0.25, 0.5], help="decision points (fractions of the budget)")
    p.add_argument("--risk", type=float, default=0.05)
    p.add_argument("--margin", type=float, default=0.02)
    p.add_argument(
        "--pooling",
        choices=POOLING,
        default=FitSettings.pooling,
        help="partial: the campaign's joint model decides (the default); none: each variant fitted alone",
    )
    p.add_argument("--out", default="artifacts/bench-adaptive")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    summaries, per_variant = [], []
    syn = []
    for i in range(args.synthetic):
        curves, truth = synthetic_campaign(i, rng)
        cfg = Adaptive(args.at, args.margin, args.risk, eval_prompts=None, n_resamples=400, pooling=args.pooling)
        t = replay(curves, cfg, truth)
        syn.append(t)
        per_variant.append(t.assign(campaign=f"synthetic#{i}"))
        print(
            f"synthetic campaign {i + 1}/{args.synthetic}: {int(t['stopped_at'].notna().sum())} stopped "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    if syn:
        summaries.append(summarise("synthetic", syn, truth=True))
    for path in sorted((ROOT / "results").glob("*/curves.csv")):
        curves = pd.read_csv(path)
        if X not in curves or "baseline" not in set(curves["variant"]):
            continue
        cfg = Adaptive(args.at, args.margin, args.risk, eval_prompts=None, n_resamples=400, pooling=args.pooling)
        t = replay(curves, cfg)
        per_variant.append(t.assign(campaign=path.parent.name))
        summaries.append(summarise(path.parent.name, [t], truth=False))
        print(f"{path.parent.name}: {int(t['stopped_at'].notna().sum())} stopped ({time.perf_counter() - t0:.0f} s)")
    table = pd.DataFrame(summaries)
    pd.concat(per_variant, ignore_index=True).to_csv(out / "decisions.csv", index=False)
    table.to_csv(out / "summary.csv", index=False)
    print()
    print(table.to_string(index=False))
    print(
        f"\nat {args.at}, margin {args.margin}, risk {args.risk}, pooling {args.pooling}; "
        f"per variant → {out}/decisions.csv "
        f"({time.perf_counter() - t0:.0f} s)"
    )


if __name__ == "__main__":
    main()

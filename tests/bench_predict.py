"""``make bench-predict``: are scalefit's predictions where the observations land?

Every curve is fitted on its first half of compute and asked for the second half (2x, the
paper's LOO practice). Two held-out sets:

- synthetic with known truth: the paper's Table 1 curves with realistic noise (a fixed set of
  validation prompts scored with 16 samples, slowly drifting run deviations, seed offsets,
  1-3 seeds pooled), budgets from before the knee to well past it;
- the project's own real curves: every run in ``results/*/curves.csv``.

For each set, the curves scalefit calls ``predictable`` and those it calls ``not yet
predictable`` are separate rows. Columns: point error at 2x (mean and worst |error| of the
final evaluation), coverage of the 90% and 95% prediction bands (every held-out evaluation,
and the final one alone), the 90% band's mean width, and the same for the paper's plain
procedure (grid fit, iid point bootstrap of the mean curve). The not-yet-predictable row says
how often that verdict was right (the prediction missed by more than the margin).
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import beta

from scalefit import FitError, bootstrap, fit_sigmoid
from scalefit.forecast import forecast
from scalefit.synthetic import TABLE1, realistic_runs

MARGIN = 0.02
REAL_X = "compute/samples"  # load-independent compute, logged by every run


def synthetic_cases(n: int, seed: int = 0):
    """(name, compute, value, runs) of n synthetic recipes with randomly drawn noise and budgets."""
    rng = np.random.default_rng(seed)
    names = list(TABLE1)
    for i in range(n):
        run = names[i % len(names)]
        cm, b, a = TABLE1[run]
        settings = dict(
            R0=float(rng.uniform(0.2, 0.4)),
            c_max=cm * float(np.exp(rng.uniform(np.log(1.5), np.log(15.0)))),  # half-budget before to past the knee
            n_points=int(rng.choice([11, 21, 41, 81])),
            n_prompts=int(rng.choice([200, 500, 1000, 2000])),
            drift_sd=float(rng.uniform(0.0, 0.02)),
            drift_phi=float(rng.uniform(0.5, 0.95)),
            seed_sd=float(rng.uniform(0.0, 0.015)),
            seeds=int(rng.choice([1, 2, 3])),
        )
        df = realistic_runs(cm, b, a, seed=seed * 100_000 + i, **settings)
        yield f"{run}#{i}", df["compute"].to_numpy(), df["value"].to_numpy(), df["seed"].to_numpy(), settings


def real_cases(root: Path):
    """(name, compute, value, runs) of every run of every results/*/curves.csv (one curve each)."""
    for csv in sorted(root.glob("*/curves.csv")):
        df = pd.read_csv(csv)
        for run, g in df.groupby("run", sort=True):
            g = g.dropna(subset=[REAL_X, "val/mean_at_16"]).sort_values(REAL_X)
            yield f"{csv.parent.name}/{run}", g[REAL_X].to_numpy(), g["val/mean_at_16"].to_numpy(), None, {}


def score(name, c, v, runs, settings: dict, n_resamples: int) -> dict | None:
    """Fit the first half, predict the rest with scalefit and with the paper's plain procedure."""
    half = 0.5 * float(c.max())
    held = c > half
    if held.sum() == 0:
        return None
    row: dict = {"curve": name, **settings}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            f = fit_sigmoid(c, v, fit_upto=half, runs=runs, a_grid=np.round(np.arange(0.05, 1.0, 0.005), 3))
            fc = forecast(f, level=0.9, target=float(c.max()), n_resamples=n_resamples, margin=MARGIN)
            plain = fit_sigmoid(
                c, v, fit_upto=half, a_grid=np.round(np.arange(0.05, 1.0, 0.005), 3), polish_optimum=False
            )
            iid = bootstrap(plain, n_resamples=n_resamples, seed=0, level=0.9)
    except FitError as e:
        return {**row, "verdict": "no fit", "note": str(e)}
    ch, vh = c[held], v[held]
    final = ch == ch.max()
    lo90, hi90 = fc.prediction_band(ch)
    lo95, hi95 = fc.prediction_band(ch, level=0.95)
    ilo, ihi = iid.predict_interval(ch)
    pred, ppred = f.predict(ch), plain.predict(ch)
    inside90, inside95, iid90 = (lo90 <= vh) & (vh <= hi90), (lo95 <= vh) & (vh <= hi95), (ilo <= vh) & (vh <= ihi)
    err_final = float(np.mean(pred[final]) - np.mean(vh[final]))
    row.update(
        verdict=fc.verdict.label,
        reasons="; ".join(fc.verdict.reasons),
        err_final=err_final,
        plain_err_final=float(np.mean(ppred[final]) - np.mean(vh[final])),
        expected_error=fc.expected_error,
        cov90_all=float(inside90.mean()),
        cov95_all=float(inside95.mean()),
        n_held=int(held.sum()),
        cov90_final=float(inside90[final].mean()),
        cov95_final=float(inside95[final].mean()),
        width90=float(np.mean((hi90 - lo90)[final])),
        iid_cov90_final=float(iid90[final].mean()),
        iid_cov90_all=float(iid90.mean()),
        iid_width90=float(np.mean((ihi - ilo)[final])),
    )
    return row


def binom_ci(k: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper–Pearson interval of a coverage of k hits in n."""
    a = (1 - level) / 2
    lo = beta.ppf(a, k, n - k + 1) if k > 0 else 0.0
    hi = beta.ppf(1 - a, k + 1, n - k) if k < n else 1.0
    return float(lo), float(hi)


def summarise(df: pd.DataFrame, label: str) -> list[dict]:
    out = []
    for verdict in ("predictable", "not yet predictable"):
        g = df[df["verdict"] == verdict]
        if g.empty:
            continue
        n = len(g)
        k90 = float(g["cov90_final"].sum())
        row = {
            "set": label,
            "verdict": verdict,
            "curves": n,
            "mean|err|@2x": g["err_final"].abs().mean(),
            "worst|err|": g["err_final"].abs().max(),
            "paper mean|err|": g["plain_err_final"].abs().mean(),
            "cov90 final": g["cov90_final"].mean(),
            "cov90 final 95%CI": "[{:.2f}, {:.2f}]".format(*binom_ci(k90, n)),
            "cov95 final": g["cov95_final"].mean(),
            "cov90 all": np.average(g["cov90_all"], weights=g["n_held"]),
            "cov95 all": np.average(g["cov95_all"], weights=g["n_held"]),
            "width90": g["width90"].mean(),
            "iid cov90 final": g["iid_cov90_final"].mean(),
            "iid cov90 all": np.average(g["iid_cov90_all"], weights=g["n_held"]),
            "iid width90": g["iid_width90"].mean(),
        }
        if verdict == "not yet predictable":
            row["verdict right"] = float((g["err_final"].abs() > MARGIN).mean())
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--synthetic", type=int, default=300, help="synthetic recipes (default 300)")
    p.add_argument("--resamples", type=int, default=400, help="bootstrap resamples per fit (default 400)")
    p.add_argument("--results", default="results", help="folder whose */curves.csv are the real curves")
    p.add_argument("--out", default="artifacts/bench-predict", help="per-curve CSVs and the summary")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = []
    for label, cases in (
        ("synthetic", synthetic_cases(args.synthetic)),
        ("real", real_cases(Path(args.results))),
    ):
        t0, rows = time.perf_counter(), []
        for i, case in enumerate(cases, 1):
            r = score(*case, n_resamples=args.resamples)
            if r is not None:
                rows.append(r)
            if i % 50 == 0:
                print(f"  {label}: {i} curves scored ({time.perf_counter() - t0:.0f} s)", flush=True)
        df = pd.DataFrame(rows)
        df.to_csv(out / f"{label}.csv", index=False)
        nofit = int((df["verdict"] == "no fit").sum())
        df["z_final"] = df["err_final"] / (df["width90"] / 3.29)
        print(f"{label}: {len(df)} curves, {nofit} without a fit, {time.perf_counter() - t0:.0f} s")
        summary += summarise(df, label)
    table = pd.DataFrame(summary)
    table.to_csv(out / "summary.csv", index=False)
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.float_format", "{:.3f}".format):
        print(table.to_string(index=False))
    print(f"per-curve rows → {out}/synthetic.csv, {out}/real.csv; summary → {out}/summary.csv")


if __name__ == "__main__":
    main()

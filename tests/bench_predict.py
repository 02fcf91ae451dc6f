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

Campaigns (the issue-28 targets): every recorded GPU study (``results/loo-gpu*/curves.csv``, its
campaign's fit settings) and a set of synthetic campaigns are fitted on the first half of each
variant's compute, jointly (``fit.pooling: partial``, today's default) and one variant at a time
(``none``, the method before it), and each variant's prediction of the mean of its seeds' last
3 evaluations at the budget is scored: within ±0.02, 90% band coverage, RMS and largest |z|,
the verdict's recall and precision, the band's median half-width against the seed-noise floor
1.645·σ/√k, the rank correlation of expected and actual errors, and how often a call made at
half the budget (worse / no difference / better) agrees with the call at the budget. Each study
is fitted alone: no prior is shared across studies, so no study informs its own score.

Baselines to beat (issue 58), per GPU study and for the tuning and held-out sets (``HELD_OUT``,
chosen before the method changed): the trivial rule (the level at half the budget plus half the
last doubling's rise), a perfect predictor under the study's seed noise, the method; the RMS z over
banded and over predictable forecasts; half-budget calls against the measured ones. Then the
unstable-run flag's false-flag rate on simulated healthy campaigns (``tests/bench_unstable.py``).
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import beta, norm, spearmanr

from scalefit import FitError, bootstrap, fit_sigmoid
from scalefit.data.synthetic import TABLE1, realistic_runs
from scalefit.forecasts.single import forecast

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
        if not {"run", REAL_X, "val/mean_at_16"} <= set(df.columns):
            continue  # not a campaign's evaluations (results/fsdp: a sharding study's own columns)
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
    p.add_argument("--synthetic-campaigns", type=int, default=8, help="synthetic campaigns (default 8)")
    p.add_argument("--efficiency-campaigns", type=int, default=4, help="synthetic efficiency studies (default 4)")
    p.add_argument("--campaign-resamples", type=int, default=300, help="bootstrap resamples per campaign fit")
    p.add_argument("--campaigns-only", action="store_true", help="only the campaign section (the issue-28 targets)")
    p.add_argument(
        "--studies",
        default="loo-gpu*," + ",".join(REPLICATES),
        help="which results/ studies the campaign section scores (comma-separated globs)",
    )
    p.add_argument(
        "--unstable-studies", type=int, default=500, help="simulated campaigns per tail for the unstable flag (0: skip)"
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    campaigns_main(args, out)
    if args.unstable_studies:
        from tests.bench_unstable import run

        print("\n" + "\n".join(run(args.unstable_studies, results=Path(args.results))))
    if args.campaigns_only:
        return
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


# ---------------------------------------------------------------- campaigns (issue 28)

STUDIES = ("loo-gpu3", "loo-gpu4", "loo-gpu5")  # the issue's reference set; every loo-gpu* study is also scored
LAST_K = 3
ISSUE_TODAY = {  # the issue's figures for today's method over loo-gpu3/4/5 (32 half-compute predictions)
    "within ±0.02 of the last-3 mean": "15/32",
    "90% band coverage": "27/32",
    "expected-error rank correlation": "0.08",
    "predictable when within ±0.02": "1/15",
}


def _settings(study: str, pooling: str) -> dict:
    """The study's campaign fit settings (its eval size, grid, margin) with ``pooling`` set."""
    from runners.campaign.load import load_campaign

    try:
        fit = load_campaign(study).fit.to_dict()
    except ValueError:
        fit = {"x": REAL_X, "a_grid": "0.05:1.0:0.005"}
    return {**fit, "pooling": pooling, "last_k": LAST_K}


def as_loo_curves(df: pd.DataFrame) -> pd.DataFrame:
    """``scalefit.data.synthetic.campaign_runs``'s table as a campaign's curves (``analysis fit``'s columns):
    a step every 10, compute in completions, mean@16, each variant its own axis, runs named variant/seedN."""
    df = df.assign(step=df.groupby(["variant", "seed"]).cumcount() * 10)
    df = df.rename(columns={"compute": REAL_X, "value": "val/mean_at_16"})
    return df.assign(axis=df["variant"], run=df["variant"] + "/seed" + df["seed"].astype(str))


def synthetic_campaigns(n: int, seed: int = 0):
    """(name, curves, fit settings) of n synthetic campaigns with known truth: 6-10 variants each,
    B spread around a campaign value (none, a little, a lot), budgets from near the knee to well past it."""
    from scalefit.data.synthetic import campaign_runs

    rng = np.random.default_rng(seed)
    for i in range(n):
        b0, tau = float(rng.uniform(1.2, 2.5)), float(rng.choice([0.0, 0.1, 0.3]))
        cm0 = 3000.0
        truth = {
            ("baseline" if j == 0 else f"v{j}"): (
                cm0 * float(rng.uniform(0.7, 1.4)),
                b0 * float(np.exp(rng.normal(0, tau))),
                float(rng.uniform(0.55, 0.8)),
            )
            for j in range(int(rng.integers(6, 11)))
        }
        df = campaign_runs(
            truth,
            seeds=int(rng.choice([2, 3])),
            seed=seed * 1000 + i,
            c_max=cm0 * float(rng.uniform(3.0, 10.0)),
            n_points=int(rng.choice([21, 31])),
            n_prompts=int(rng.choice([300, 1000])),
            drift_sd=float(rng.uniform(0.004, 0.015)),
            drift_phi=float(rng.uniform(0.6, 0.95)),
            seed_sd=float(rng.uniform(0.003, 0.012)),
        )
        df = as_loo_curves(df)
        yield f"synthetic#{i} (tau {tau:g})", df, {"x": REAL_X, "a_grid": "0.05:1.0:0.005", "last_k": LAST_K}


# The efficiency study of issue 40 item 5, synthetic until its GPU run: arms the paper and loo-gpu3..6
# say change C_mid or B and not A (a learning rate halved and quartered, a smaller batch, fewer
# generations per prompt) beside a positive and a negative control, 4 seeds an arm, run until the
# slowest passes its knee (budget 3x its C_mid). name -> (C_mid factor, B factor, ΔA).
EFFICIENCY_ARMS = {
    "baseline": (1.0, 1.0, 0.0),
    "lr_half": (2.0, 1.0, 0.0),
    "lr_quarter": (4.0, 1.0, 0.0),
    "batch_half": (1.6, 0.85, 0.0),
    "generations_4": (1.4, 0.9, 0.0),
    "control=better": (1.0, 1.0, +0.12),
    "control=lower": (1.0, 1.0, -0.08),
}


def efficiency_campaigns(n: int, seed: int = 7):
    """(name, curves, fit settings) of n synthetic efficiency studies (``EFFICIENCY_ARMS``) with
    loo-gpu6's noise (300 prompts, run-to-run drift, a seed offset), each its own A, B and C_mid."""
    from scalefit.data.synthetic import campaign_runs

    rng = np.random.default_rng(seed)
    for i in range(n):
        cm0, b0, a0 = 3000.0, float(rng.uniform(1.3, 2.3)), float(rng.uniform(0.6, 0.8))
        truth = {v: (cm0 * fc, b0 * fb, a0 + da) for v, (fc, fb, da) in EFFICIENCY_ARMS.items()}
        df = campaign_runs(
            truth,
            seeds=4,
            seed=seed * 1000 + i,
            c_max=3 * 4 * cm0,
            n_points=41,
            n_prompts=300,
            drift_sd=float(rng.uniform(0.004, 0.012)),
            drift_phi=float(rng.uniform(0.6, 0.95)),
            seed_sd=float(rng.uniform(0.003, 0.01)),
        )
        df = as_loo_curves(df)
        yield f"efficiency#{i}", df, {"x": REAL_X, "a_grid": "0.05:1.0:0.005", "last_k": LAST_K}


def true_calls(curves: pd.DataFrame, margin: float) -> dict[str, str]:
    """Each synthetic variant's call at the budget from its noise-free curve (``truth``): the mean of
    its last ``LAST_K`` evaluations against the baseline's."""
    end = {v: float(g.sort_values(REAL_X)["truth"].iloc[-LAST_K:].mean()) for v, g in curves.groupby("variant")}
    out = {}
    for v, t in end.items():
        d = t - end["baseline"]
        out[v] = "worse" if d < -margin else "better" if d > margin else "no difference"
    return out


def reading_summary(df: pd.DataFrame) -> str:
    """How the half-budget readings of the synthetic efficiency studies match their truth: the
    efficiency arms (same A, later C_mid) read slower and never lower; the controls higher / lower."""
    d = df[(df["method"] == "new") & df["study"].str.startswith("efficiency") & df["half_reading"].notna()]
    eff = d[~d["variant"].str.startswith("control") & (d["variant"] != "baseline")]
    slower = eff["half_reading"].str.startswith("slower").sum()
    lower = eff["half_reading"].isin(["lower", "higher"]).sum()
    ctrl = d[d["variant"].str.startswith("control")]
    right = ((ctrl["variant"] == "control=better") & (ctrl["half_reading"] == "higher")) | (
        (ctrl["variant"] == "control=lower") & (ctrl["half_reading"] == "lower")
    )
    return (
        f"efficiency arms read slower {slower}/{len(eff)}, read as a ceiling change {lower}/{len(eff)}; "
        f"controls read right (higher / lower) {int(right.sum())}/{len(ctrl)}"
    )


def perfect_rate(model, variant: str, seeds: int, margin: float = MARGIN) -> float:
    """How often a perfect predictor (the recipe's true mean curve) lands within ±``margin`` of the
    mean of ``seeds`` seeds' last ``LAST_K`` evaluations at the budget, under the seed noise the fit
    to all of it estimates there (``noise_sd``: its pool is the campaign's, so any variant's
    forecast serves one without a fit); NaN where the model has no such noise estimate."""
    from scalefit.forecasts.pooled import PooledForecast

    fcs = [model.forecasts[variant]] if variant in model.forecasts else []
    fcs += list(model.forecasts.values())
    fc = next((f for f in fcs if isinstance(f, PooledForecast) and LAST_K in f.mean_windows), None)
    if fc is None:
        return np.nan
    sd = fc.noise_sd(float(fc.fit.compute.max()), seeds, LAST_K)
    return float(2 * norm.cdf(margin / sd) - 1) if sd > 0 else 1.0


def trivial_prediction(g: pd.DataFrame, x: str) -> float:
    """The rule to beat (issue 58): the level at half the budget (the seeds' mean of their last
    ``LAST_K`` evaluations up to half the variant's final compute) plus half of the last doubling's
    rise (that level less the same at a quarter of it)."""

    def level(where: float) -> float:
        out = []
        for _, gs in g.sort_values(x).groupby("seed"):
            before = gs.loc[gs[x] <= where * (1 + 1e-9), "val/mean_at_16"].to_numpy()
            out.append(before[-LAST_K:].mean() if len(before) else np.nan)
        return float(np.nanmean(out))

    budget = float(g.groupby("seed")[x].max().min())
    half, quarter = level(budget / 2), level(budget / 4)
    return half + 0.5 * (half - quarter)


def _call_label(measured: str) -> str:
    if not isinstance(measured, str):
        return "cannot tell yet"
    return {"worse": "worse", "better": "better"}.get(
        measured, "no difference" if "within" in measured else "cannot tell yet"
    )


def score_campaign(name: str, curves: pd.DataFrame, fit: dict, n_resamples: int) -> pd.DataFrame:
    """One row per variant and method: the half-budget prediction of the last-3 mean, scored."""
    from analysis.loo import calls, campaign_model, extrapolation_check, measured_at_budget
    from analysis.planner import pooled_seed_sd
    from runners.campaign.spec import fit_settings

    x = fit.get("x", REAL_X)
    sd = pooled_seed_sd(curves, x, 1.0, LAST_K)
    measured = measured_at_budget(curves, x, fit.get("margin", MARGIN), last_k=LAST_K)
    truth_call = dict(zip(measured["variant"], measured[f"measured_last{LAST_K}_label"].map(_call_label), strict=True))
    lo_hi = zip(measured[f"measured_last{LAST_K}_lo"], measured[f"measured_last{LAST_K}_hi"], strict=True)
    resolved = dict(zip(measured["variant"], lo_hi, strict=True))
    rows = []
    for method, pooling in (("new", "partial"), ("today", "none")):
        cfg = fit_settings({**fit, "pooling": pooling})  # parsed as load_campaign parses a fit: section
        half = campaign_model(curves, cfg, n_resamples, fraction=0.5)
        full = campaign_model(curves, cfg, n_resamples)
        ex = extrapolation_check(curves, cfg, model=half)
        called = calls(full, half, cfg.margin, curves, x, LAST_K).set_index("variant")
        for _, r in ex.iterrows():
            seeds = int(curves.loc[curves["variant"] == r["variant"], "seed"].nunique())
            trivial = trivial_prediction(curves[curves["variant"] == r["variant"]], x)
            row = {
                "study": name,
                "method": method,
                "variant": r["variant"],
                "seeds": seeds,
                "floor": 1.645 * sd.sd_last_k / np.sqrt(seeds),
                "fit_model": half.description,
                "perfect": perfect_rate(full, r["variant"], seeds) if method == "new" else np.nan,
                "perfect_measured": float(2 * norm.cdf(MARGIN * np.sqrt(seeds) / sd.sd_last_k) - 1),
                "observed": r[f"observed_last{LAST_K}"],
                "trivial_error": trivial - r[f"observed_last{LAST_K}"],
            }
            if r["variant"] in called.index:
                row["half_call"] = called.loc[r["variant"], "half_call"]
                reading = called.loc[r["variant"]].get("half_reading")  # as the LOO table reads it
                row["half_reading"] = reading if isinstance(reading, str) else "no reading"
                row["full_call"] = called.loc[r["variant"], "call"]
                row["measured_call"] = truth_call.get(r["variant"], "cannot tell yet")
                row["measured_lo"], row["measured_hi"] = resolved.get(r["variant"], (np.nan, np.nan))
                if "truth" in curves:
                    row["true_call"] = true_calls(curves, fit.get("margin", MARGIN)).get(r["variant"])
            if "predicted" not in r or pd.isna(r.get("predicted")):
                rows.append({**row, "verdict": "no fit"})
                continue
            err = r[f"error_last{LAST_K}"]
            if method == "new":
                lo, hi = r[f"band_last{LAST_K}_lo"], r[f"band_last{LAST_K}_hi"]
                z, expected = r[f"z_last{LAST_K}"], r[f"expected_error_last{LAST_K}"]
                pred = r[f"predicted_last{LAST_K}"]
            else:  # today's band is for one evaluation at the budget: centred on the last-3 prediction
                pred = r[f"predicted_last{LAST_K}"]
                half_w = (r["band_hi"] - r["band_lo"]) / 2
                lo, hi = pred - half_w, pred + half_w
                z, expected = err / (half_w / 1.645), r["expected_error"]
            row.update(
                error=err,
                banded=bool(np.isfinite(lo)),
                in_band=bool(lo <= r[f"observed_last{LAST_K}"] <= hi) if np.isfinite(lo) else np.nan,
                # the band without an open ceiling's lift of its top (issue 58's coverage target)
                in_band_closed=(
                    bool(lo <= r[f"observed_last{LAST_K}"] <= hi - np.nan_to_num(r.get(f"open_rise_last{LAST_K}", 0.0)))
                    if np.isfinite(lo)
                    else np.nan
                ),
                p_within=(model_p(half, r["variant"]) if method == "new" else np.nan),
                half_width=(hi - lo) / 2 if np.isfinite(lo) else np.nan,
                z=z,
                expected_error=expected,
                verdict=r["verdict"],
                predicted=pred,
            )
            rows.append(row)
    return pd.DataFrame(rows)


def model_p(model, variant: str) -> float:
    """The half-budget forecast's P(within ±margin) (``Forecast.p_within``; NaN: none)."""
    fc = model.forecasts.get(variant)
    p = fc.p_within if fc is not None else None
    return np.nan if p is None else float(p)


def campaign_summary(df: pd.DataFrame) -> dict:
    """The issue's figures over one set of predictions of one method."""
    fitted = df[df["verdict"] != "no fit"]
    within = fitted["error"].abs() <= MARGIN
    banded = fitted[fitted["banded"].astype(bool)]
    z = banded["z"].astype(float)
    pred = fitted["verdict"] == "predictable"
    ranked = banded[np.isfinite(banded["expected_error"].astype(float))]
    rank = spearmanr(ranked["expected_error"], ranked["error"].abs())[0] if len(ranked) > 2 else np.nan
    decisive = (
        df["half_call"].isin(["worse", "no difference", "better"]) if "half_call" in df else df["study"] != df["study"]
    )
    calls = df[decisive]
    return {
        "predictions": len(fitted),
        "within ±0.02": f"{int(within.sum())}/{len(fitted)}",
        "within share": within.mean() if len(fitted) else np.nan,
        "banded": len(banded),
        "cov90": f"{int(banded['in_band'].astype(bool).sum())}/{len(banded)}",
        "cov90 share": banded["in_band"].astype(bool).mean() if len(banded) else np.nan,
        "RMS z": float(np.sqrt(np.mean(z**2))) if len(z) else np.nan,
        "max |z|": float(z.abs().max()) if len(z) else np.nan,
        "|z|>3": int((z.abs() > 3).sum()),
        "predictable": int(pred.sum()),
        "recall": f"{int((pred & within).sum())}/{int(within.sum())}",
        "recall share": (pred & within).sum() / max(within.sum(), 1),
        "precision": f"{int((pred & within).sum())}/{int(pred.sum())}",
        "precision share": (pred & within).sum() / pred.sum() if pred.any() else np.nan,
        "median half-width": float(banded["half_width"].median()) if len(banded) else np.nan,
        "median floor": float(banded["floor"].median()) if len(banded) else np.nan,
        "rank corr": rank,
        "calls": len(calls),
        "agree (joint)": f"{int((calls['half_call'] == calls['full_call']).sum())}/{len(calls)}",
        "agree share": (calls["half_call"] == calls["full_call"]).mean() if len(calls) else np.nan,
        "agree (measured)": f"{int((calls['half_call'] == calls['measured_call']).sum())}/{len(calls)}",
        "agree (truth)": (
            f"{int((calls['half_call'] == calls['true_call']).sum())}/{len(calls)}"
            if "true_call" in calls and len(calls) and calls["true_call"].notna().all()
            else "—"
        ),
    }


def _targets(today: dict, new: dict) -> list[tuple[str, str, str, str]]:
    def pct(v: float) -> str:
        return "—" if v is None or not np.isfinite(v) else f"{v:.0%}"

    ratio_t = today["median half-width"] / today["median floor"]
    ratio_n = new["median half-width"] / new["median floor"]
    return [
        (
            "within ±0.02 of the last-3 mean ≥ 80%",
            f"{today['within ±0.02']} ({pct(today['within share'])})",
            f"{new['within ±0.02']} ({pct(new['within share'])})",
            str(new["within share"] >= 0.8),
        ),
        (
            "90% band coverage in 85–95%",
            f"{today['cov90']} ({pct(today['cov90 share'])})",
            f"{new['cov90']} ({pct(new['cov90 share'])})",
            str(0.85 <= new["cov90 share"] <= 0.95),
        ),
        (
            "RMS of standardized errors in 0.9–1.1",
            f"{today['RMS z']:.2f}",
            f"{new['RMS z']:.2f}",
            str(0.9 <= new["RMS z"] <= 1.1),
        ),
        (
            "no |z| > 3",
            f"{today['|z|>3']} (max {today['max |z|']:.1f})",
            f"{new['|z|>3']} (max {new['max |z|']:.1f})",
            str(new["|z|>3"] == 0),
        ),
        (
            "predictable for ≥ 50% of those within ±0.02",
            f"{today['recall']} ({pct(today['recall share'])})",
            f"{new['recall']} ({pct(new['recall share'])})",
            str(new["recall share"] >= 0.5),
        ),
        (
            "right ≥ 90% when it says predictable",
            f"{today['precision']} ({pct(today['precision share'])})",
            f"{new['precision']} ({pct(new['precision share'])})",
            str(bool(new["precision share"] >= 0.9)) if np.isfinite(new["precision share"]) else "n/a (none said)",
        ),
        (
            "median half-width ≤ 1.5 × floor 1.645·σ/√k",
            f"{today['median half-width']:.4f} ({ratio_t:.2f}x)",
            f"{new['median half-width']:.4f} ({ratio_n:.2f}x)",
            str(ratio_n <= 1.5),
        ),
        ("expected error ranks actual errors (Spearman)", f"{today['rank corr']:.2f}", f"{new['rank corr']:.2f}", "—"),
        (
            "half-budget calls agree with the budget's ≥ 95%",
            f"{today['agree (joint)']} ({pct(today['agree share'])})",
            f"{new['agree (joint)']} ({pct(new['agree share'])})",
            str(bool(new["agree share"] >= 0.95)) if np.isfinite(new["agree share"]) else "n/a (no call)",
        ),
    ]


def per_study_rates(df: pd.DataFrame) -> str:
    """Per study (the joint model's predictions): the share within ±0.02 of the last-3 mean beside
    the share a perfect predictor would reach under the study's seed noise (``perfect_rate``,
    averaged over the same predictions) and their ratio (the issue's target: ≥ 0.9x), beside the
    same rate from the seeds' measured spread at the budget (``floor``), and the 90% band coverage."""
    lines = [
        "\nwithin ±0.02 per GPU study (joint model) against a perfect predictor under the study's seed noise"
        " (target ≥ 0.9x), and 90% band coverage:"
    ]
    for study, g in df.groupby("study"):
        fitted = g[g["verdict"] != "no fit"]
        banded = fitted[fitted["banded"].astype(bool)]
        within = int((fitted["error"].abs() <= MARGIN).sum())
        achieved = within / len(fitted) if len(fitted) else np.nan
        perfect = float(fitted["perfect"].mean()) if len(fitted) else np.nan
        measured = float(np.mean(2 * norm.cdf(MARGIN * 1.645 / fitted["floor"]) - 1)) if len(fitted) else np.nan
        ratio = achieved / perfect if perfect > 0 else np.nan
        cov = int(banded["in_band"].astype(bool).sum())
        lines.append(
            f"  {study}: within {within}/{len(fitted)} ({achieved:.0%}), perfect predictor {perfect:.0%} "
            f"({measured:.0%} by the measured seed spread), ratio {ratio:.2f}x "
            f"({'met' if ratio >= 0.9 else 'not met'}); 90% band coverage {cov}/{len(banded)}"
            + (f" ({cov / len(banded):.0%})" if len(banded) else "")
        )
    return "\n".join(lines)


HELD_OUT = ("loo-gpu4", "loo-gpu6", "loo-gpu7")  # issue 58's test set, chosen first (docs/benchmarks.md)
# fresh GPU replicates run after the method froze (024a936): new seeds and newly built base models
REPLICATES = ("loo-gpu7-rep", "builds-gpu-rep")


def is_gpu_study(study: pd.Series) -> pd.Series:
    """The recorded GPU LOO studies and the fresh replicates (not the synthetic campaigns)."""
    return study.str.startswith("loo-gpu") | study.isin(REPLICATES)


ISSUE58_BEFORE = (  # the issue's figures for the method before it, published studies loo-gpu3…7
    "within ±0.02 28/41 (68%); trivial rule 59% and perfect predictor 96% (of 63 with the replicates); "
    "predictable right 4/4; RMS z 1.54 over predictable, 1.86 over banded; 10/10 half-budget calls right, "
    "6 clear losers with no call"
)


def _rms(z: pd.Series) -> str:
    z = z.astype(float).dropna()
    return f"{np.sqrt(np.mean(z**2)):.2f} ({len(z)})" if len(z) else "—"


def baseline_row(label: str, g: pd.DataFrame) -> dict:
    """One study's (or set's) baselines to beat beside the method (issue 58): within ±0.02 of the
    last-3 mean for the trivial rule, a perfect predictor under the seed noise, and the method."""
    fitted = g[g["verdict"] != "no fit"]
    banded = fitted[fitted["banded"].astype(bool)]
    pred = fitted["verdict"] == "predictable"
    within = fitted["error"].abs() <= MARGIN
    trivial = g["trivial_error"].abs() <= MARGIN
    calls = g[g["half_call"].isin(["worse", "no difference", "better"])] if "half_call" in g else g.iloc[:0]
    clear = g[(g["measured_lo"] > 3 * MARGIN) | (g["measured_hi"] < -3 * MARGIN)] if "measured_lo" in g else g.iloc[:0]
    called = clear["half_call"].isin(["worse", "no difference", "better"]).sum() if len(clear) else 0

    def share(k: int, n: int) -> str:
        return f"{k}/{n} ({k / n:.0%})" if n else "—"

    return {
        "study": label,
        "arms": len(g),
        "trivial (fitted arms)": share(int(trivial[fitted.index].sum()), len(fitted)),
        "trivial (every arm)": share(int(trivial.sum()), len(g)),
        "perfect": f"{fitted['perfect_measured'].mean():.0%}" if len(fitted) else "—",
        "method": share(int(within.sum()), len(fitted)),
        "cover 90 (no lift)": share(int(banded["in_band_closed"].astype(bool).sum()), len(banded))
        if "in_band_closed" in banded
        else "—",
        "RMS z": _rms(banded["z"]),
        "RMS z predictable": _rms(banded.loc[banded["verdict"] == "predictable", "z"]),
        "predictable right": f"{int((pred & within).sum())}/{int(pred.sum())}",
        "half calls right": f"{int((calls['half_call'] == calls['measured_call']).sum())}/{len(calls)}",
        "clear arms called": f"{int(called)}/{len(clear)}",
    }


def baselines(df: pd.DataFrame) -> str:
    """The baselines to beat per GPU study and per set (tuning, held out, all), the joint model."""
    real = df[(df["method"] == "new") & is_gpu_study(df["study"])]
    held, fresh = real["study"].isin(HELD_OUT), real["study"].isin(REPLICATES)
    tag = {**dict.fromkeys(HELD_OUT, " (held out)"), **dict.fromkeys(REPLICATES, " (fresh replicate)")}
    rows = [baseline_row(f"{st}{tag.get(st, '')}", g) for st, g in real.groupby("study")]
    rows += [
        baseline_row("tuning set", real[~held & ~fresh]),
        baseline_row("held-out set", real[held]),
        baseline_row("fresh replicates", real[fresh]),
        baseline_row("held out + replicates", real[held | fresh]),
        baseline_row("every GPU study", real),
    ]
    head = (
        "\nbaselines to beat (issue 58; joint model): within ±0.02 of the budget's last-3 mean for the trivial"
        " rule (level at half + half the last doubling's rise), a perfect predictor under the study's seed"
        " noise (2Φ(0.02√k/σ)−1, σ the seeds' sd of the last-3 mean at the budget) and the method; RMS z over"
        " banded forecasts and over predictable ones (n); half-budget calls agreeing with the measured call;"
        " arms the budget's measurement resolves beyond ±3×0.02 that got a half-budget call\n"
    )
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_colwidth", 40):
        return head + pd.DataFrame(rows).to_string(index=False) + f"\nbefore issue 58: {ISSUE58_BEFORE}"


def campaigns_main(args, out: Path) -> None:
    t0 = time.perf_counter()
    frames = []
    studies = sorted({csv for pat in args.studies.split(",") for csv in Path(args.results).glob(f"{pat}/curves.csv")})
    for csv in studies:
        name = csv.parent.name
        t = time.perf_counter()
        frames.append(score_campaign(name, pd.read_csv(csv), _settings(name, "partial"), args.campaign_resamples))
        print(f"  {name}: scored ({time.perf_counter() - t:.0f} s) — {frames[-1]['fit_model'].iloc[0]}", flush=True)
    synthetic = list(synthetic_campaigns(args.synthetic_campaigns))
    for name, curves, fit in synthetic + list(efficiency_campaigns(args.efficiency_campaigns)):
        t = time.perf_counter()
        frames.append(score_campaign(name, curves, fit, args.campaign_resamples))
        print(f"  {name}: scored ({time.perf_counter() - t:.0f} s)", flush=True)
    df = pd.concat(frames, ignore_index=True)
    df.to_csv(out / "campaigns.csv", index=False)
    sets = {
        "GPU studies loo-gpu3/4/5 (the issue's set)": df["study"].isin(STUDIES),
        "every GPU study": is_gpu_study(df["study"]),
        # a replicated reference: GPU studies whose every arm has >= 4 seeds, so the targets sit well above seed noise
        "GPU studies with ≥ 4 seeds an arm": is_gpu_study(df["study"])
        & df["study"].map(df.groupby("study")["seeds"].min()).ge(4),
        "synthetic campaigns": df["study"].str.startswith("synthetic"),
        "synthetic efficiency studies (issue 40 item 5's design)": df["study"].str.startswith("efficiency"),
    }
    rows = []
    for label, sel in sets.items():
        if not sel.any():
            continue
        today, new = (campaign_summary(df[sel & (df["method"] == m)]) for m in ("today", "new"))
        print(f"\n{label}: {new['predictions']} half-compute predictions (today's method fits {today['predictions']})")
        print("| target | today | joint model | met |\n|---|---|---|---|")
        for t in _targets(today, new):
            print("| " + " | ".join(t) + " |")
            rows.append({"set": label, "target": t[0], "today": t[1], "new": t[2], "met": t[3]})
    print(
        "\nhalf-budget calls per study (joint model): agreement with the call at the budget, and with the measured call"
    )
    real = is_gpu_study(df["study"])
    for study, g in df[(df["method"] == "new") & (real | df["study"].str.startswith("efficiency"))].groupby("study"):
        s = campaign_summary(g)
        agree = f"agree {s['agree (joint)']} (joint), {s['agree (measured)']} (measured)"
        agree += f", {s['agree (truth)']} (truth)" if s["agree (truth)"] != "—" else ""
        print(f"  {study}: {s['calls']} calls made, {agree}")
    print(per_study_rates(df[(df["method"] == "new") & real]))
    print(baselines(df))
    if "half_reading" in df and df["study"].str.startswith("efficiency").any():
        print("\nhalf-budget readings, synthetic efficiency studies: " + reading_summary(df))
    print(
        "\nthe issue's figures for the method before this one (loo-gpu3/4/5): "
        + "; ".join(f"{k} {v}" for k, v in ISSUE_TODAY.items())
    )
    pd.DataFrame(rows).to_csv(out / "campaign_targets.csv", index=False)
    print(
        f"campaigns: {time.perf_counter() - t0:.0f} s; rows → {out}/campaigns.csv, targets → {out}/campaign_targets.csv"
    )


if __name__ == "__main__":
    main()

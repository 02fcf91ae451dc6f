"""``make bench-fit``: naive per-cell procedure vs scalefit's vectorised fit, same data and grid;
the forecast (bands + backtests) of one curve; the joint fit and forecast of a 12-variant campaign;
fit time and peak memory at 1k, 50k, 200k points; the whole ``python -m scalefit fit --seed-col seed``
path (fit + forecast) at 3 x 20,000, 10 x 2,000 and 20 x 10,000 evaluations, its time and peak
resident memory (target < 1.5 GB)."""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from scalefit import bootstrap, fit_sigmoid, forecast
from scalefit.data.synthetic import TABLE1, synthetic_curve
from scalefit.models.grids import PAPER_A_GRID, PAPER_CMID_GRID
from tests.naive_fit import naive_fit
from tests.scale_cases import run_measured, seeds_csv

FORECAST_CASES = ((3, 20_000), (10, 2_000), (20, 10_000))  # seeds x evaluations per seed
RSS_TARGET = 1.5e9


def best_of(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def joint_campaign() -> None:
    """A 12-variant campaign (3 seeds x 31 evaluations each, one B): the joint fit and its forecast."""
    from scalefit.data.synthetic import campaign_runs
    from scalefit.forecasts.pooled import forecast_campaign
    from scalefit.forecasts.pooled_fit import fit_campaign

    rng = np.random.default_rng(0)
    truth = {f"v{i}": (3000 * rng.uniform(0.7, 1.4), 1.9, rng.uniform(0.55, 0.8)) for i in range(12)}
    df = campaign_runs(truth, seeds=3, c_max=15_000, n_points=31, drift_sd=0.01, seed_sd=0.008)
    curves = {
        v: (g["compute"].to_numpy(), g["value"].to_numpy(), g["seed"].to_numpy()) for v, g in df.groupby("variant")
    }
    a_grid = np.round(np.arange(0.05, 1.0, 0.005), 3)
    t_fit, cfit = best_of(lambda: fit_campaign(curves, a_grid=a_grid), 2)
    t_none, _ = best_of(lambda: fit_campaign(curves, a_grid=a_grid, pooling="none"), 2)
    t_fc, fcs = best_of(lambda: forecast_campaign(cfit, n_resamples=1000), 1)
    print(
        f"joint fit       : {t_fit:9.2f} s   (target: seconds; 12 variants x 3 seeds x 31 points; one by one "
        f"{t_none:.2f} s) → {cfit.describe()}"
    )
    print(
        f"joint forecast  : {t_fc:9.2f} s   (1,000 seed-bootstrap resamples of the campaign + "
        f"{sum(len(f.backtests) for f in fcs.values())} backtests)"
    )


def main() -> None:
    cm, b, a = TABLE1["ScaleRL"]
    compute, value = synthetic_curve(cm, b, a, c_max=16_000.0, n_points=161, seed=0)
    keep = compute >= 1500
    r0 = float(value[0])
    print(
        f"data: ScaleRL Table 1 curve + mean@16 noise, {keep.sum()} points >= 1.5k GPU-h; "
        f"grid {len(PAPER_A_GRID)} A x {len(PAPER_CMID_GRID)} C_mid = {len(PAPER_A_GRID) * len(PAPER_CMID_GRID)} cells"
    )
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")

    t_naive, ref = best_of(lambda: naive_fit(compute[keep], value[keep], r0, PAPER_A_GRID, PAPER_CMID_GRID), 1)
    fit_kw = dict(r0=r0, exclude_below=1500, cmid_grid=PAPER_CMID_GRID)
    t_fast, fit = best_of(lambda: fit_sigmoid(compute, value, **fit_kw), 5)
    t_boot, boot = best_of(lambda: bootstrap(fit, n_resamples=1000, seed=0), 3)

    same_cell = ref["A"] == fit.grid_A and ref["C_mid"] == fit.grid_C_mid
    for label, t, r in (("naive reference", t_naive, ref), ("fast fit", t_fast, fit.to_dict())):
        print(
            f"{label:16s}: {t * 1e3:9.1f} ms  A {r['A']:.3f} C_mid {r['C_mid']:.1f} B {r['B']:.4f} SSE {r['sse']:.8g}"
        )
    print(
        f"speed-up        : {t_naive / t_fast:9.1f} x   (target >= 100x, grid + polish); same cell: {same_cell}; "
        f"SSE fast <= naive: {fit.sse <= ref['sse'] * (1 + 1e-9)}"
    )
    print(
        f"bootstrap 1000  : {t_boot * 1e3:9.1f} ms   (target < 1000 ms)   A 95% "
        f"[{boot.interval('A')[0]:.3f}, {boot.interval('A')[1]:.3f}]"
    )
    t_fc, fc = best_of(lambda: forecast(fit, n_resamples=1000), 3)
    print(
        f"forecast        : {t_fc * 1e3:9.1f} ms   (target < 1000 ms: fit's bands from 1,000 correlated resamples + "
        f"{len(fc.backtests)} backtests) → {fc.verdict.label}"
    )
    joint_campaign()
    print("scaling in n (paper grids, one fit each; numpy allocations traced):")
    for n in (1_000, 50_000, 200_000):
        c, v = synthetic_curve(cm, b, a, c_max=16_000.0, n_points=n, n_prompts=1000, seed=1)
        tracemalloc.start()
        t = time.perf_counter()
        f = fit_sigmoid(c, v, exclude_below=1500, cmid_grid=PAPER_CMID_GRID)
        dt = time.perf_counter() - t
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"  n = {n:>7,}: {dt:7.2f} s, peak {peak / 2**20:7.1f} MiB (ceiling 500 MiB), A {f.A:.3f}")
    print("fit + forecast, `python -m scalefit fit FILE --seed-col seed` (default grids, 1,000 resamples):")
    for seeds, n in FORECAST_CASES:
        forecast_path(seeds, n)
    if not np.isfinite(fit.sse):
        raise SystemExit("fit failed")


def forecast_path(seeds: int, n: int) -> None:
    """One CLI fit + forecast of ``seeds`` x ``n`` evaluations: wall time and peak RSS of the process."""
    with tempfile.TemporaryDirectory() as tmp:
        csv = seeds_csv(Path(tmp) / "curves.csv", seeds, n, n_prompts=200)
        cmd = [sys.executable, "-m", "scalefit", "fit", str(csv), "--x", "gpu_hours", "--y", "mean_at_16"]
        t = time.perf_counter()
        rc, out, err, peak = run_measured([*cmd, "--seed-col", "seed"], Path(tmp))
        dt = time.perf_counter() - t
    a_line = next((line.strip() for line in out.splitlines() if line.strip().startswith("A ")), "")
    status = a_line if rc == 0 else f"FAILED (exit {rc}): {err.strip().splitlines()[-1:]}"
    print(
        f"  {seeds:>2} x {n:>6,} = {seeds * n:>7,} points: {dt:6.1f} s, peak RSS {peak / 1e9:5.2f} GB "
        f"(target < {RSS_TARGET / 1e9:.1f} GB)  {status}"
    )


if __name__ == "__main__":
    main()

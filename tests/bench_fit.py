"""``make bench-fit``: naive per-cell procedure vs scalefit's vectorised fit, same data and grid;
the forecast (bands + backtests) of one curve; the joint fit and forecast of a 12-variant campaign;
fit time and peak memory at 1k, 50k, 200k points."""

from __future__ import annotations

import os
import platform
import time
import tracemalloc

import numpy as np

from scalefit import bootstrap, fit_sigmoid, forecast
from scalefit.grids import PAPER_A_GRID, PAPER_CMID_GRID
from scalefit.synthetic import TABLE1, synthetic_curve
from tests.naive_fit import naive_fit


def best_of(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def joint_campaign() -> None:
    """A 12-variant campaign (3 seeds x 31 evaluations each, one B): the joint fit and its forecast."""
    from scalefit.pooled import fit_campaign
    from scalefit.pooled_forecast import forecast_campaign
    from scalefit.synthetic import campaign_runs

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
    if not np.isfinite(fit.sse):
        raise SystemExit("fit failed")


if __name__ == "__main__":
    main()

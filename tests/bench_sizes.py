"""``make bench-sizes``: the across-size fit's time and calibration on the CPU.

Time: 10 sizes x 5 seeds (31 evaluations a run, synthetic from known laws): the per-size fits, the
choice of forms by leave-one-size-out error and the forecast of the largest size, median of 3
(issue 44's target: < 5 s); and the leave-one-size-out backtest of the 9 fitted sizes.
Calibration: replicated synthetic studies shaped like ``scale-gpu`` (5 sizes of its parameter
counts x 3 seeds), the largest forecast from the other four: how often its true A lies inside the
90% interval, |A error|, and the share of its mean curve's evaluations inside the 90% band.
Builds (issue 62): 5 sizes x 3 builds x 2 seeds, each build's A offset with an sd of 0.08 (a level's
between-build sd at micro, results/builds-gpu): the across-size fit's time (median of 3; target < 5 s),
the leave-one-size-out backtest's coverage, and over replicated studies how often the largest size's
build-averaged true A lies inside the 90% interval and the band's coverage of each build's curve.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pandas as pd

from scalefit.data.synthetic import size_runs
from scalefit.sizes import backtest_sizes, forecast_size, size_data

GPU_SIZES = {"nano": 463_008, "micro": 1_673_120, "mini": 5_298_944, "medium": 14_240_640, "large": 25_790_912}


def laws(n: float) -> tuple[float, float, float, float]:
    """A, C_mid, B, R0 of a size of n parameters (a saturating A, a power-law C_mid)."""
    return 0.95 - 0.9 * (n / 1e5) ** -0.35, 3e4 * (n / 1e6) ** 0.3, 1.8, 0.3 + 0.03 * np.log(n / 1e5)


def study(sizes: dict[str, float], seeds: int, seed: int, builds: int = 1, build_sd: float = 0.0) -> dict:
    return as_data(frame(sizes, seeds, seed, builds, build_sd))


def frame(sizes: dict[str, float], seeds: int, seed: int, builds: int = 1, build_sd: float = 0.0) -> pd.DataFrame:
    return size_runs(
        sizes,
        lambda n: laws(n)[0],
        lambda n: laws(n)[1],
        lambda n: laws(n)[2],
        lambda n: laws(n)[3],
        seeds=seeds,
        seed=seed,
        c_max=153_600,
        n_points=31,
        n_prompts=300,
        builds=builds,
        build_sd=build_sd,
    )


def as_data(df: pd.DataFrame) -> dict:
    return size_data(
        {
            k: (g["parameters"].iloc[0], g["compute"], g["value"], g["seed"], g.get("build"))
            for k, g in df.groupby("size")
        }
    )


def bench_builds(replications: int) -> None:
    """5 sizes x 3 builds x 2 seeds: the fit's time, the backtest's coverage, the forecast's calibration."""
    data = study(GPU_SIZES, seeds=2, seed=0, builds=3, build_sd=0.08)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fc = forecast_size(data, "large")
        times.append(time.perf_counter() - t0)
    lo, hi = fc.interval("A")
    print(
        f"across-size fit with builds, 5 sizes x 3 builds x 2 seeds x 31 evaluations: {np.median(times):.2f} s "
        f"(median of 3; target < 5 s); large: A {fc.A:.3f} [{lo:.3f}, {hi:.3f}], σ_build {fc.build_sd:.3f} "
        f"({fc.build_source})"
    )
    t0 = time.perf_counter()
    bt = backtest_sizes({k: d for k, d in data.items() if k != "large"})
    print(f"  leave-one-size-out backtest of the other 4: {time.perf_counter() - t0:.2f} s; {bt.lines()[0]}")
    rows = []
    for r in range(replications):
        df = frame(GPU_SIZES, seeds=2, seed=200 + r, builds=3, build_sd=0.08)
        fc = forecast_size(as_data(df), "large", seed=r)
        true_a = float(df[df["size"] == "large"].groupby("build")["build_A"].first().mean())
        rows.append(
            {
                "A_inside": fc.interval("A")[0] <= true_a <= fc.interval("A")[1],
                "A_error": fc.A - true_a,
                "half_width": np.diff(fc.interval("A"))[0] / 2,
                "band": fc.actual["band_coverage"],
                "band_by_build": fc.actual["band_coverage_builds_mean"],
                "sigma": fc.build_sd,
            }
        )
    t = pd.DataFrame(rows)
    print(
        f"  calibration, {len(t)} synthetic studies (5 sizes x 3 builds x 2 seeds, σ_build 0.08): large's "
        f"build-averaged true A inside the 90% interval {t['A_inside'].mean():.0%}, |A error| median "
        f"{t['A_error'].abs().median():.3f}, A half-width median {t['half_width'].median():.3f}; the 90% band holds "
        f"{t['band'].mean():.0%} of the mean curve's evaluations and {t['band_by_build'].mean():.0%} of each "
        f"build's (against one build's band); σ_build estimated median {t['sigma'].median():.3f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replications", type=int, default=10, help="synthetic studies for the calibration (default 10)")
    p.add_argument("--builds-only", action="store_true", help="only the study with builds (issue 62)")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    if args.builds_only:
        bench_builds(args.replications)
        return
    ten = {f"s{i}": float(n) for i, n in enumerate(np.geomspace(3e5, 4e7, 10))}
    data = study(ten, seeds=5, seed=0)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fc = forecast_size(data, "s9")
        times.append(time.perf_counter() - t0)
    print(f"across-size fit, 10 sizes x 5 seeds x 31 evaluations: {np.median(times):.2f} s (median of 3; target < 5 s)")
    lo, hi = fc.interval("A")
    print(f"  forecast of s9: A {fc.A:.3f} [{lo:.3f}, {hi:.3f}], true {laws(ten['s9'])[0]:.3f}")
    t0 = time.perf_counter()
    bt = backtest_sizes({k: d for k, d in data.items() if k != "s9"})
    print(f"leave-one-size-out backtest of the other 9: {time.perf_counter() - t0:.2f} s; {bt.lines()[0]}")
    rows = []
    for r in range(args.replications):
        fc = forecast_size(study(GPU_SIZES, seeds=3, seed=100 + r), "large", seed=r)
        true_a = laws(GPU_SIZES["large"])[0]
        rows.append(
            {
                "A_inside": fc.interval("A")[0] <= true_a <= fc.interval("A")[1],
                "A_error": fc.A - true_a,
                "band": fc.actual["band_coverage"],
                "half_width": np.diff(fc.interval("A"))[0] / 2,
                "predictable": fc.verdict.predictable,
            }
        )
    df = pd.DataFrame(rows)
    print(
        f"calibration, {len(df)} synthetic scale-gpu studies (5 sizes x 3 seeds), large forecast from the others: "
        f"true A inside the 90% interval {df['A_inside'].mean():.0%}, |A error| median"
        f" {df['A_error'].abs().median():.3f} max {df['A_error'].abs().max():.3f}, A half-width median"
        f" {df['half_width'].median():.3f}, "
        f"90% band holds {df['band'].mean():.0%} of the evaluations, predictable {df['predictable'].mean():.0%}"
    )
    bench_builds(args.replications)


if __name__ == "__main__":
    main()

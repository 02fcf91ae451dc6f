"""scalefit.sizes.builds through the sizes room: a size of several base-model builds takes the mean over its
builds with the between-build spread (not leave-one-seed-out), the forecast's band carries one build's
spread of A, the outputs say how many builds each size holds, the size trend is stated with build noise
and its planner, and a study of one build a size gives exactly the numbers it gave before (issue 62)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scalefit.cli import main
from scalefit.data.synthetic import size_runs
from scalefit.sizes import fit_size, forecast_size, read_sizes, size_data
from scalefit.sizes.builds import SEPARATE_AT, SIGMA_BUILD_A, build_sd_of_a, builds_needed
from tests.scale_cases import size_curves

N = {"a": 0.46e6, "b": 1.67e6, "c": 5.3e6, "d": 14.2e6, "e": 25.8e6}
ROOT = Path(__file__).resolve().parents[1]


def A_of(n):
    return 0.95 - 0.9 * (n / 1e5) ** -0.35


def runs(sizes=N, seeds: int = 2, seed: int = 1, builds: int = 3, build_sd: float = 0.06, **laws) -> pd.DataFrame:
    f = {"A_of": A_of, "cmid_of": lambda n: 3e4 * (n / 1e6) ** 0.3, "b_of": lambda n: 1.8,
         "r0_of": lambda n: 0.3 + 0.03 * np.log(n / 1e5), **laws}  # fmt: skip
    return size_runs(sizes, seeds=seeds, seed=seed, builds=builds, build_sd=build_sd, c_max=153_600, n_points=31,
                     n_prompts=300, **f)  # fmt: skip


def as_data(df: pd.DataFrame, builds: bool = True):
    return size_data(
        {
            k: (g.parameters.iloc[0], g.compute, g.value, g.seed, g.get("build") if builds else None)
            for k, g in df.groupby("size")
        }
    )


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_a_size_of_several_builds_is_the_mean_over_its_builds_with_the_between_build_spread():
    """Each build fitted alone on its seeds; the size's A their mean, its ± the sd across builds / sqrt(builds).
    Over a few synthetic studies that se matches the known between-build sd to within 30%, where one build's
    leave-a-seed-out ± (all a study of one build a size has) understates it several times."""
    build_sd, nb = 0.08, 6
    scaled, seeds_only = [], []
    for draw in range(2):
        df = runs(sizes={k: N[k] for k in "abcd"}, seed=10 + draw, builds=nb, build_sd=build_sd)
        data = as_data(df)
        for name, d in data.items():
            f = fit_size(name, d)
            assert f.n_builds == nb and d.n_builds == nb and f.n_seeds == 2 * nb
            alone = [fit_size(name, sub) for sub in d.by_build().values()]
            each = [b.theta["A"] for b in alone]
            assert f.theta["A"] == pytest.approx(np.mean(each))  # the mean over builds
            assert f.sd["A"] == pytest.approx(max(np.std(each, ddof=1) / np.sqrt(nb), f.sd["A"]))
            assert f.sd["A"] >= np.std(each, ddof=1) / np.sqrt(nb) - 1e-12
            scaled.append((f.sd["A"] * np.sqrt(nb)) ** 2)
            seeds_only += [b.sd["A"] ** 2 for b in alone]
    estimate = float(np.sqrt(np.mean(scaled)))
    assert abs(estimate / build_sd - 1) < 0.3, estimate
    assert np.sqrt(np.median(seeds_only)) < 0.3 * build_sd  # one build's ± from its seeds (median): far too small


def test_the_forecast_band_carries_the_between_build_spread_estimated_from_the_smaller_sizes():
    flat = {"A_of": lambda n: 0.7, "cmid_of": lambda n: 4e4, "r0_of": lambda n: 0.4}  # A far from its bound of 1
    data = as_data(runs(build_sd=0.06, **flat))
    fc = forecast_size(data, "e")
    sd, source, dof = build_sd_of_a(fc.fits)
    assert fc.build_applied and fc.n_builds == 3 and fc.build_sd == sd and dof == 4 * 2
    assert source == "pooled between builds of a, b, c, d (8 df)"  # the smaller sizes', never e's own
    added = np.var(fc.draws["A"]) - np.var(fc.draws["A_law"])
    assert added == pytest.approx(sd**2 / 3, rel=0.25)  # one build's variance over the size's three builds
    c, _, k = data["e"].mean_curve()
    lo3, hi3 = fc.prediction_band(c, k)
    lo1, hi1 = fc.prediction_band(c, k, builds=1)
    assert np.mean(hi1 - lo1) > np.mean(hi3 - lo3) > 0  # one build's mean is wider apart than three's
    assert fc.interval("A") == fc.A_interval_builds
    assert set(fc.actual["band_coverage_by_build"]) == {"b0", "b1", "b2"}
    # no fitted size of several builds: the target's builds take the value measured at micro, named as such
    one = as_data(runs(builds=1, **flat))
    mixed = {**{k: v for k, v in one.items() if k != "e"}, "e": data["e"]}
    fc = forecast_size(mixed, "e")
    assert fc.build_applied and fc.build_sd == SIGMA_BUILD_A and "results/builds-gpu" in fc.build_source


def test_the_outputs_say_how_many_builds_each_size_holds(tmp_path, capsys):
    df = runs().rename(columns={"compute": "compute/samples", "value": "val/mean_at_16"})
    df.to_csv(tmp_path / "c.csv", index=False)
    assert main(["sizes", str(tmp_path / "c.csv"), "--json", str(tmp_path / "f.json"),
                 "--plot", str(tmp_path / "f.png")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "the mean over its builds, ± the between-build standard error" in out
    assert "seeds 6  builds 3" in out and "builds per size: a 3, b 3, c 3, d 3; e 3 builds" in out
    assert "by build (each against one build's band): b0 " in out and "size trend of A, with build noise" in out
    record = json.loads((tmp_path / "f.json").read_text())
    assert record["builds"]["per_size"] == {"a": 3, "b": 3, "c": 3, "d": 3} and record["builds"]["in_band"]
    assert all(f["builds"] == 3 for f in record["fitted_sizes"].values())
    assert main(["sizes", str(tmp_path / "c.csv"), "--builds", "0"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: --builds 0: give how many base-model builds") and out == ""
    df.drop(columns="build").to_csv(tmp_path / "one.csv", index=False)  # every run of a size one build
    assert main(["sizes", str(tmp_path / "one.csv")]) == 0
    out = capsys.readouterr().out
    assert "builds per size: a 1, b 1, c 1, d 1; e 1 build: each size's ± is its seeds' alone and lacks" in out
    assert f"σ_build of A {SIGMA_BUILD_A:.3f} (measured at micro, results/builds-gpu)" in out and "understates" in out


def test_a_trend_within_build_noise_is_said_so_with_the_builds_that_would_separate_it():
    """Neighbouring sizes' A differ by 0.03: with one build each, their interval holds zero and the planner names
    the builds per size at which the difference's se falls to a 2.8th of it; sizes 0.15 apart separate."""
    close = {"A_of": lambda n: 0.6 + 0.03 * np.log2(n / 0.46e6) / np.log2(3.6)}  # +0.03 a step
    fc = forecast_size(as_data(runs(builds=1, **close)), "e")
    trend = fc.trend
    assert not fc.build_applied and trend["sigma_build_A"] == SIGMA_BUILD_A
    assert [p["sizes"] for p in trend["pairs"]] == [["a", "b"], ["b", "c"], ["c", "d"], ["d", "e"]]
    assert not any(p["separate"] for p in trend["pairs"]) and "do not separate beyond build noise" in trend["statement"]
    for p in trend["pairs"]:
        lo, hi = p["interval"]
        assert lo < 0 < hi and p["se"] > SIGMA_BUILD_A  # one build a size: √2 σ_build and more
    assert "needs ≥ " in trend["statement"] or "needs more than" in trend["statement"]
    assert builds_needed(0.1, 0.01, 0.01) == int(np.ceil(0.02 * (SEPARATE_AT / 0.1) ** 2))  # 16 builds
    n = builds_needed(0.1, 0.01, 0.01)
    assert np.sqrt(0.02 / n) <= 0.1 / SEPARATE_AT < np.sqrt(0.02 / (n - 1))
    apart = forecast_size(as_data(runs(builds=3, build_sd=0.03)), "e").trend  # A rises 0.19, 0.11, 0.07 a step
    assert apart["pairs"][0]["separate"] and apart["pairs"][0]["builds_needed"] is None


def test_one_build_a_size_gives_the_recorded_numbers_of_scale_gpu2_plus_its_builds_statement():
    """results/scale-gpu2/sizes.json (`scalefit sizes sizes.csv --holdout large --r0 0.4725`), refitted: every
    recorded number the laws' draws do not set the same (to float noise between machines), the builds and the
    size trend added. The draws' numbers moved with the laws' misfit prior and Student's t (issue 62): A's
    interval widened and now holds large's A, which the recorded one missed."""
    recorded = json.loads((ROOT / "results/scale-gpu2/sizes.json").read_text())
    data = read_sizes(str(ROOT / "results/scale-gpu2/sizes.csv"), "compute/samples", "val/mean_at_16")
    assert {d.n_builds for d in data.values()} == {1}
    record = json.loads(json.dumps(forecast_size(data, "large", r0=0.4725).to_dict()))
    added = set(record) - set(recorded)
    assert added == {"builds", "size_trend"} and not set(recorded) - set(record)
    assert record["builds"]["per_size"] == dict.fromkeys(["nano", "micro", "mini", "medium"], 1)
    assert not record["builds"]["in_band"] and record["builds"]["sigma_build_A"] == SIGMA_BUILD_A
    for f in record["fitted_sizes"].values():
        assert f.pop("builds") == 1
    drawn = {"A", "A_interval", "passes", "curve", "actual", "reasons"}
    kept = {k: v for k, v in recorded.items() if k not in drawn}
    assert same({k: v for k, v in record.items() if k not in drawn}, kept), "a recorded number moved"
    assert record["predictable"] == recorded["predictable"] and record["reasons"][0] == recorded["reasons"][0]
    (lo, hi), (lo0, hi0) = record["A_interval"], recorded["A_interval"]
    assert lo < lo0 and hi > hi0 and not recorded["actual"]["A_inside"] and record["actual"]["A_inside"]


def same(new, old) -> bool:
    """``old``'s every key and value in ``new``, numbers to within float noise between machines."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(k in new and same(new[k], v) for k, v in old.items())
    if isinstance(old, list):
        return isinstance(new, list) and len(new) == len(old) and all(map(same, new, old))
    if isinstance(old, float) and isinstance(new, float):
        return new == pytest.approx(old, rel=1e-6, abs=1e-8)
    return new == old


def test_analysis_fit_of_a_scale_campaign_with_builds_fits_each_size_build_by_build(tmp_path):
    """A scale campaign of ``builds: 3`` (seed S of build B runs as B * 1000 + S, its ``build`` column the
    weights): ``analysis.sizes.write_sizes`` fits each size build by build and sizes.md/json say so."""
    from analysis.sizes import write_sizes
    from runners.task.sizes import parameter_count

    names = ["nano", "micro", "mini", "medium", "large"]
    df = runs(sizes={n: parameter_count(n) for n in names})
    curves = size_curves(df).assign(
        build=df["size"] + df["build"]
    )  # a hash per size and build, as load_curves gives it
    said = "\n".join(write_sizes(curves, tmp_path, "compute/samples"))
    md = (tmp_path / "sizes.md").read_text()
    assert "builds per size: nano 3, micro 3, mini 3, medium 3; large 3 builds" in md and "builds 3" in said
    record = json.loads((tmp_path / "sizes.json").read_text())
    assert record["builds"]["in_band"] and record["fitted_sizes"]["micro"]["builds"] == 3
    assert len(record["size_trend"]["pairs"]) == 4  # large's own fit (its three builds) joins the trend

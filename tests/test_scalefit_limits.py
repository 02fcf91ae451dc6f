"""scalefit at scale and at its edges: bounded forecast memory (thinning, chunked resamples and
bands), output paths checked before the fit, CSV errors that name the file line."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scalefit import FitError, fit_sigmoid, forecast
from scalefit.cli import read_curves
from scalefit.data.synthetic import TABLE1, realistic_runs, synthetic_curve
from scalefit.forecasts import interface as prediction
from tests.conftest import remount, tmpfs
from tests.scale_cases import run_measured, seeds_csv

fc_mod = importlib.import_module("scalefit.forecasts.single")  # the module; ``scalefit.forecast`` is the function
TARGET = 1536 * 2**20  # any fit and forecast of up to 200k points under 1.5 GB of resident memory


@pytest.mark.slow
def test_a_200k_point_forecast_runs_under_the_memory_target(tmp_path):
    """20 seeds x 10,000 evaluations: the bootstrap once asked for (1000, 199980, 3) arrays and
    was killed at 24 GB; now it fits and forecasts within 1.5 GB of resident memory. (The address
    space, which counts reserved but unused memory, is capped at 4 GiB only so that a regression
    fails fast instead of taking the machine.)"""
    csv, out = tmp_path / "big.csv", tmp_path / "fit.json"
    seeds_csv(csv, seeds=20, n=10_000)
    cmd = [sys.executable, "-m", "scalefit", "fit", str(csv), "--x", "gpu_hours", "--y", "mean_at_16"]
    cmd += ["--seed-col", "seed", "--cmid-grid", "1000:6000:11", "--a-grid", "0.55:0.68:0.005", "--json", str(out)]
    rc, stdout, stderr, peak = run_measured(cmd, tmp_path, limit=4 * 2**30)
    assert rc == 0, stderr[-2000:]
    assert peak < TARGET, f"peak RSS {peak / 2**20:.0f} MiB"
    res = json.loads(out.read_text())
    assert res["n_points"] == 199_980 and abs(res["A"] - 0.61) <= 0.01
    fc = res["forecast"]
    assert fc["refitted_points"] <= fc_mod.FORECAST_POINTS  # thinned, every run alike
    lo, hi = fc["A_interval"]
    assert lo < res["A"] < hi and hi - lo < 0.05
    assert "thinned" in stdout and res["verdict"]["label"] in ("predictable", "not yet predictable")


def _drifting_fit(seeds: int, n: int):
    cm, b, a = TABLE1["ScaleRL"]
    df = realistic_runs(cm, b, a, n_points=n, seeds=seeds, n_prompts=200, drift_sd=0.0, seed_sd=0.0, seed=4)
    return fit_sigmoid(df["compute"], df["value"], runs=df["seed"], a_grid=np.arange(0.45, 0.8, 0.005))


def test_thinning_keeps_every_kth_evaluation_of_each_run_and_its_start():
    fit = _drifting_fit(seeds=3, n=401)  # 1,200 fitted points + 3 at zero compute
    assert fc_mod.thin_runs(fit) is fit  # at most FORECAST_POINTS: nothing thinned
    thin = fc_mod.thin_runs(fit, max_points=300)
    assert (thin.A, thin.B, thin.C_mid, thin.R0) == (fit.A, fit.B, fit.C_mid, fit.R0)
    assert thin.n_points == 300 and len(thin.inputs[0]) == 303  # 100 per run, and each run's zero-compute start
    for run in range(3):
        mine = thin.run_inputs == run
        c = thin.inputs[0][mine]
        assert c.min() == 0.0 and c.max() == fit.compute.max()  # the whole range: start, first and last kept
        steps = np.diff(np.sort(c[c > 0])) / 40.0  # in evaluations (one every 40 units of compute)
        assert set(np.round(steps)) == {4.0, 5.0}  # every 4th or 5th of 400: evenly spaced in order


def test_a_thinned_forecast_is_no_narrower_than_the_full_datas(monkeypatch):
    """Thinning is the same estimator on fewer points: its intervals are as wide or wider, never
    (as thinning in log-compute would make C_mid's) narrower."""
    fit = _drifting_fit(seeds=3, n=401)
    full = forecast(fit, n_resamples=300, backtest=False)
    assert full.refitted_points == fit.n_points
    monkeypatch.setattr(fc_mod, "FORECAST_POINTS", 300)
    thin = forecast(fit, n_resamples=300, backtest=False)
    assert thin.refitted_points == 300
    for p in ("A", "B", "C_mid"):
        (lo_f, hi_f), (lo_t, hi_t) = full.interval(p), thin.interval(p)
        assert hi_t - lo_t >= 0.9 * (hi_f - lo_f), p


def test_chunked_resamples_bound_memory_and_repeat_for_a_seed(monkeypatch):
    fit = _drifting_fit(seeds=2, n=801)
    noise = fc_mod.noise_model(fit)

    def run():
        tracemalloc.start()
        out = fc_mod.correlated_bootstrap(fit, noise, 400, seed=3)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return out, peak

    (whole, _, _), peak_whole = run()
    monkeypatch.setattr(fc_mod, "BOOT_CHUNK_FLOATS", 40 * len(fit.inputs[0]))  # 10 chunks of 40 resamples
    (chunked, _, _), peak_chunked = run()
    (again, _, _), _ = run()
    assert np.array_equal(chunked, again)  # the same seed, the same draws
    assert peak_chunked < peak_whole / 4
    for i in range(3):  # other draws from the same distribution: the 90% intervals agree
        (lo_w, hi_w), (lo_c, hi_c) = np.percentile(whole[:, i], [5, 95]), np.percentile(chunked[:, i], [5, 95])
        assert abs(lo_c - lo_w) < 0.25 * (hi_w - lo_w) and abs(hi_c - hi_w) < 0.25 * (hi_w - lo_w)


def test_bands_over_many_compute_values_are_computed_in_chunks(monkeypatch):
    fit = _drifting_fit(seeds=1, n=101)
    fc = forecast(fit, n_resamples=100, backtest=False)
    grid = np.linspace(1_000.0, 32_000.0, 50)
    c_whole, p_whole = fc.confidence_band(grid), fc.prediction_band(grid)
    monkeypatch.setattr(prediction, "BAND_CHUNK_FLOATS", 4000 * 7)  # 7 compute values per chunk
    c_chunked, p_chunked = fc.confidence_band(grid), fc.prediction_band(grid)
    assert all(np.array_equal(a, b) for a, b in zip(c_whole, c_chunked, strict=True))  # no randomness: equal
    assert all(np.allclose(a, b, atol=0.005) for a, b in zip(p_whole, p_chunked, strict=True))


def test_a_resample_count_beyond_the_limit_is_refused_up_front(tmp_path):
    c, v = synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0)
    csv = tmp_path / "one.csv"
    pd.DataFrame({"h": c, "m": v}).to_csv(csv, index=False)
    cmd = [sys.executable, "-m", "scalefit", "fit", str(csv), "--x", "h", "--y", "m", "--bootstrap", "10000000"]
    rc, _, stderr, _ = run_measured(cmd, tmp_path, limit=4 * 2**30)  # the cap: it once tried, and took the machine
    assert rc == 2 and "--bootstrap" in stderr and "100,000" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_an_unwritable_output_is_refused_before_the_fit(tmp_path, cli, option):
    csv = tmp_path / "curves.csv"
    seeds_csv(csv, seeds=2, n=101)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for dest, why in ((blocker / "x.out", f"{blocker} is a file, not a folder"), (tmp_path, "it is a folder")):
        args = ["fit", str(csv), "--x", "gpu_hours", "--y", "mean_at_16", "--seed-col", "seed", option, str(dest)]
        r = cli("scalefit", *args)
        assert r.returncode == 2, r.stderr[-2000:]
        assert r.stderr.splitlines() == [f"error: {option} {dest}: cannot write there ({why}); nothing was fitted"]
        assert "fitting" not in r.stderr and not r.stdout  # refused before reading the data: no fit, no summary


@contextlib.contextmanager
def folder_that_takes_no_files(where: Path) -> Iterator[Path]:
    """A real folder that refuses new files: one without write permission, or, for root (whom
    permissions do not stop), a read-only tmpfs mounted there, as the fault tests mount theirs."""
    where.mkdir()
    if os.geteuid() != 0:
        where.chmod(0o500)
        try:
            yield where
        finally:
            where.chmod(0o700)
        return
    with tmpfs(where, 64):
        remount(where, "ro")
        yield where


def test_an_output_in_a_folder_that_takes_no_files_is_refused(tmp_path, cli):
    """A folder that takes no files (no write permission; for root, a read-only file system): the
    nearest existing folder is tried with a real file, so either is caught before the fit."""
    c, v = synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0)
    csv = tmp_path / "one.csv"
    pd.DataFrame({"h": c, "m": v}).to_csv(csv, index=False)
    with folder_that_takes_no_files(tmp_path / "locked") as locked:
        dest = locked / "new" / "x.json"  # a folder to create inside it, as --json would
        r = cli("scalefit", "fit", str(csv), "--x", "h", "--y", "m", "--json", str(dest))
        assert not (locked / "new").exists()
    why = "Permission denied" if os.geteuid() != 0 else "Read-only file system"
    assert r.returncode == 2 and r.stderr.startswith(f"error: --json {dest}: cannot write there ({locked}: {why})")
    assert "fitting" not in r.stderr and not r.stdout


@pytest.mark.parametrize(
    "rows,line,msg",
    [
        (["0,0.3", "1,0.4", "2,abc"], 4, "column 'p' is not a number: 'abc'"),
        (["0,0.3", "", "1,0.4", "2,1.5"], 5, "column 'p' (1.5) lies outside [0, 1]"),  # a blank line counts
        (["0,0.3", "1,", "2,0.5"], 3, "column 'p' is empty"),
        (["0,0.3", "-2,0.4", "2,0.5"], 3, "column 'h' (-2) is negative"),
        (["0,0.3", "1,0.4", "inf,0.5"], 4, "column 'h' (inf) is not finite"),
        (["0.5,0.3", "1,0.4"], 2, None),  # no error: the header is line 1, the first data row line 2
    ],
)
def test_csv_errors_name_the_file_line(tmp_path, rows, line, msg):
    csv = tmp_path / "c.csv"
    csv.write_text("\n".join(["h,p", *rows]) + "\n")
    if msg is None:
        assert len(read_curves(str(csv), "h", "p", "run")["c"][0]) == len(rows)
        return
    with pytest.raises(FitError) as e:
        read_curves(str(csv), "h", "p", "run")
    assert str(e.value).startswith(f"{csv}: line {line}: {msg}")


def test_a_csv_row_with_no_run_name_is_an_error_with_its_line(tmp_path, cli):
    csv = tmp_path / "runs.csv"
    csv.write_text("run,h,p\na,0,0.3\na,1,0.4\n,2,0.5\n")
    r = cli("scalefit", "fit", str(csv), "--x", "h", "--y", "p")
    assert r.returncode == 2 and f"{csv}: line 4: column 'run' is empty" in r.stderr

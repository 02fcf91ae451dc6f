"""scalefit: the paper's fitting procedure, its speed-ups checked against the naive reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from scalefit import FitError, bootstrap, compare_fits, fit_power_law, fit_sigmoid, seed_spread, sigmoid
from scalefit.data.synthetic import TABLE1, synthetic_curve, table1_frame
from scalefit.models.grids import PAPER_A_GRID, PAPER_CMID_GRID
from tests.conftest import run_in_process
from tests.naive_fit import naive_fit


@pytest.mark.parametrize("run", list(TABLE1))
def test_recovers_table1_parameters(run):
    cm, b, a = TABLE1[run]
    c, v = synthetic_curve(cm, b, a, c_max=50_000.0, n_points=101, n_prompts=4000, seed=7)
    f = fit_sigmoid(c, v, exclude_below=1500, cmid_grid=PAPER_CMID_GRID)
    assert abs(f.A - a) <= 0.01
    assert abs(f.B - b) / b < 0.25
    assert abs(f.C_mid - cm) / cm < 0.15
    assert pytest.approx(v[0]) == f.R0


@pytest.mark.parametrize("run,seed", [("ScaleRL", 0), ("math+code/code", 3), ("ScaleRL-32k", 5)])
@pytest.mark.slow
def test_same_optimum_as_naive_procedure(run, seed):
    cm, b, a = TABLE1[run]
    c, v = synthetic_curve(cm, b, a, c_max=16_000.0, n_points=161, seed=seed)
    keep = c >= 1500
    ref = naive_fit(c[keep], v[keep], float(v[0]), PAPER_A_GRID, PAPER_CMID_GRID)
    paper = fit_sigmoid(c, v, exclude_below=1500, cmid_grid=PAPER_CMID_GRID, polish_optimum=False)
    assert (paper.A, paper.C_mid) == (ref["A"], ref["C_mid"])
    assert paper.sse <= ref["sse"] * (1 + 1e-9)
    assert pytest.approx(ref["B"], rel=1e-4) == paper.B
    f = fit_sigmoid(c, v, exclude_below=1500, cmid_grid=PAPER_CMID_GRID)  # polished continuously from that cell
    assert (f.grid_A, f.grid_C_mid) == (ref["A"], ref["C_mid"])
    assert f.sse <= paper.sse
    assert abs(f.A - paper.A) < 0.005 and abs(f.C_mid - paper.C_mid) < 0.2 * paper.C_mid


def test_exact_curve_fits_to_zero_error():
    c, v = synthetic_curve(2000.0, 1.5, 0.6, c_max=20_000.0, n_prompts=None)
    f = fit_sigmoid(c, v, cmid_grid=np.linspace(500, 4000, 15))
    assert (f.grid_A, f.grid_C_mid) == (0.6, 2000.0)
    assert pytest.approx(0.6, abs=1e-6) == f.A and f.C_mid == pytest.approx(2000.0, rel=1e-6)
    assert pytest.approx(1.5, rel=1e-6) == f.B
    assert f.sse < 1e-20
    assert f.predict(0.0) == pytest.approx(v[0])
    np.testing.assert_allclose(f.predict(c), v, atol=1e-9)


def test_bootstrap_intervals_cover_truth_and_widen_beyond_data():
    truth = dict(C_mid=2542, B=1.92, A=0.610)
    covered_a = covered_pred = 0
    for seed in range(20):
        c, v = synthetic_curve(truth["C_mid"], truth["B"], truth["A"], c_max=16_000.0, n_points=161, seed=seed)
        f = fit_sigmoid(c, v, exclude_below=1500, cmid_grid=PAPER_CMID_GRID)
        boot = bootstrap(f, n_resamples=1000, seed=0)
        lo, hi = boot.interval("A")
        covered_a += lo <= truth["A"] <= hi
        (lo_in, lo_out), (hi_in, hi_out) = boot.predict_interval([4000.0, 200_000.0])
        covered_pred += lo_in <= sigmoid(4000.0, truth["A"], truth["B"], truth["C_mid"], 0.30) <= hi_in
        assert hi - lo < 0.03
        assert hi_out - lo_out > hi_in - lo_in  # less certain far beyond the fitted points
    assert covered_a >= 15 and covered_pred >= 15  # nominal 95%; R0 is fixed at a noisy first point


def test_extrapolation_reports_error_on_held_out_points():
    c, v = synthetic_curve(2542, 1.92, 0.610, c_max=16_000.0, n_points=161, seed=2)
    f = fit_sigmoid(c, v, exclude_below=1500, fit_upto=8000, cmid_grid=PAPER_CMID_GRID)
    assert f.compute.max() <= 8000
    ex = f.extrapolation()
    assert ex["n_heldout"] == int((c > 8000).sum())
    assert ex["final_compute"] == 16_000.0
    assert abs(ex["final_error"]) < 0.02 and ex["mae"] < 0.02
    assert fit_sigmoid(c, v, exclude_below=1500).extrapolation() is None


def test_compare_higher_asymptote_wins():
    c1, v1 = synthetic_curve(2542, 1.92, 0.610, c_max=16_000.0, seed=1)
    c2, v2 = synthetic_curve(11272, 1.89, 0.645, c_max=50_000.0, seed=2)
    f1, f2 = (fit_sigmoid(c, v, exclude_below=1500, cmid_grid=PAPER_CMID_GRID) for c, v in ((c1, v1), (c2, v2)))
    cmp = compare_fits(f1, f2, names=("base", "32k"))
    assert cmp.rule == "A" and cmp.winner == "32k" and cmp.shared_A is None


def test_compare_same_asymptote_decided_by_b():
    c1, v1 = synthetic_curve(2542, 2.0, 0.610, c_max=16_000.0, seed=1)
    c2, v2 = synthetic_curve(2542, 1.2, 0.600, c_max=16_000.0, seed=2)
    f1, f2 = (fit_sigmoid(c, v, exclude_below=1500, cmid_grid=PAPER_CMID_GRID) for c, v in ((c1, v1), (c2, v2)))
    cmp = compare_fits(f1, f2, names=("base", "slow"))
    assert cmp.rule == "B" and cmp.winner == "base"
    assert cmp.shared_A == pytest.approx((f1.A + f2.A) / 2)
    assert cmp.B_baseline > cmp.B_candidate
    assert "shared A" in cmp.verdict


def test_seed_spread_matches_paper_margin():
    curves = {f"seed{s}": synthetic_curve(2542, 1.92, 0.610, c_max=16_000.0, seed=s) for s in range(3)}
    spread = seed_spread(curves, exclude_below=1500, cmid_grid=PAPER_CMID_GRID).to_dict()
    assert spread["within_margin"] and spread["A_half_range"] <= 0.02
    assert set(spread["A_by_run"]) == set(curves)


def test_power_law_overshoots_a_saturating_curve():
    """Paper App. A.7: a power law fitted to a saturating run predicts a far higher asymptote."""
    c, v = synthetic_curve(11272, 1.89, 0.645, c_max=50_000.0, seed=4)
    sig = fit_sigmoid(c, v, exclude_below=1500, cmid_grid=PAPER_CMID_GRID)
    pl = fit_power_law(c, v, exclude_below=1500)
    assert pl.A > sig.A + 0.05
    assert sig.sse < pl.sse


@pytest.mark.parametrize(
    "compute,value,msg",
    [
        ([0, 1, 2, np.nan, 4], [0.1, 0.2, 0.3, 0.4, 0.5], "NaN/inf"),
        ([0, 1, -2, 3, 4], [0.1, 0.2, 0.3, 0.4, 0.5], "compute must be >= 0"),
        ([0, 1, 2, 3, 4], [0.1, 0.2, 1.3, 0.4, 0.5], r"must lie in \[0, 1\]"),
        ([0, 1, 2, 3], [0.1, 0.2, 0.3, 0.4], "need at least 4"),
        ([0, 1, 2, 3, 4, 5], [0.5, 0.5, 0.49, 0.5, 0.5, 0.49], "no sigmoid gain"),
        ([0, 1, 2, 3, 4, 5], [0.5, 0.45, 0.4, 0.35, 0.3, 0.25], "no sigmoid gain"),
        ([0, 1, 2], [0.1, 0.2], "3 points but value has 2"),
    ],
)
def test_bad_input_gets_clear_error(compute, value, msg):
    with pytest.raises(FitError, match=msg):
        fit_sigmoid(compute, value)


def test_exclusion_leaving_too_few_points_names_the_option():
    c, v = synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0, n_points=17)
    with pytest.raises(FitError, match="--exclude-below"):
        fit_sigmoid(c, v, exclude_below=14_000)


def test_optimum_at_grid_edge_warns_with_direction():
    c, v = synthetic_curve(2542, 1.92, 0.90, c_max=16_000.0, n_prompts=None)
    with pytest.warns(UserWarning, match="upper edge of the A grid.*upwards"):
        f = fit_sigmoid(c, v, cmid_grid=PAPER_CMID_GRID)
    assert PAPER_A_GRID[-1] == f.grid_A == pytest.approx(f.A) and f.a_at_edge and f.warnings


def test_auto_cmid_grid_handles_any_compute_unit():
    c, v = synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0, seed=3)
    flops = c * 3.6e18  # the same curve against FLOPs
    f = fit_sigmoid(flops, v, exclude_below=1500 * 3.6e18)
    assert abs(f.A - 0.61) <= 0.01
    assert abs(f.C_mid / 3.6e18 - 2542) / 2542 < 0.2


def _run_cli(*args, check=True, shell=False):
    """``python -m scalefit ARGS``: in this process (``tests.conftest.run_in_process``), or with ``shell``
    in a process of its own, for the real exit code, stdout and stderr."""
    if shell:
        return subprocess.run([sys.executable, "-m", "scalefit", *args], capture_output=True, text=True, check=check)
    res = run_in_process("scalefit", *args)
    if check:
        res.check_returncode()
    return res


def test_cli_fit_json_on_stdout_and_plot(tmp_path):
    csv = tmp_path / "curves.csv"
    table1_frame(c_max=16_000.0, n_points=81).query("run in ['ScaleRL', 'ScaleRL-8gen']").to_csv(csv, index=False)
    png = tmp_path / "fit.png"
    out = _run_cli(
        "fit",
        str(csv),
        "--x",
        "gpu_hours",
        "--y",
        "mean_at_16",
        "--exclude-below",
        "1500",
        "--fit-upto",
        "8000",
        "--cmid-grid",
        "paper",
        "--bootstrap",
        "200",
        "--json",
        "-",
        "--plot",
        str(png),
        shell=True,  # the JSON alone on stdout of the real process
    )
    res = json.loads(out.stdout)["runs"]
    assert set(res) == {"ScaleRL", "ScaleRL-8gen"}
    for key in ("A", "B", "C_mid", "R0", "sse", "forecast", "verdict", "extrapolation"):
        assert key in res["ScaleRL"]
    assert abs(res["ScaleRL"]["A"] - 0.61) <= 0.02
    fc = res["ScaleRL"]["forecast"]
    assert fc["level"] == 0.9 and fc["ratio"] == pytest.approx(2.0)
    held = fc["heldout"]  # a band for every held-out point, not only the final one
    assert len(held) == res["ScaleRL"]["extrapolation"]["n_heldout"]
    cm, b, a = TABLE1["ScaleRL"]
    for row in held:  # a clean Table 1 curve fitted up to 8,000 GPU-h predicts the rest
        lo, hi = row["prediction_band"]
        clo, chi = row["confidence_band"]
        assert lo <= clo <= row["predicted"] <= chi <= hi
        assert abs(row["predicted"] - float(sigmoid(np.array([row["compute"]]), a, b, cm, 0.30)[0])) <= 0.02
    assert np.mean([r["in_prediction_band"] for r in held]) >= 0.75
    assert res["ScaleRL"]["verdict"]["label"] in ("predictable", "not yet predictable")
    assert "A " in out.stderr and "verdict" in out.stderr and png.stat().st_size > 10_000


def test_cli_single_curve_gives_flat_json(tmp_path):
    c, v = synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0)
    csv = tmp_path / "one.csv"
    pd.DataFrame({"hours": c, "pass": v}).to_csv(csv, index=False)
    res = json.loads(_run_cli("fit", str(csv), "--x", "hours", "--y", "pass", "--bootstrap", "0", "--json", "-").stdout)
    assert {"A", "B", "C_mid", "R0", "sse"} <= set(res)
    assert res["R0"] == pytest.approx(v[0])


def test_cli_errors_are_messages_not_tracebacks(tmp_path):
    csv = tmp_path / "bad.csv"
    pd.DataFrame({"hours": [0, 1, 2, 3, 4], "pass": [0.1, 0.2, 0.3, 2.0, 0.5]}).to_csv(csv, index=False)
    r = _run_cli("fit", str(csv), "--x", "hours", "--y", "reward", check=False, shell=True)
    assert r.returncode == 2 and "no column 'reward'" in r.stderr and "Traceback" not in r.stderr
    r = _run_cli("fit", str(csv), "--x", "hours", "--y", "pass", check=False)
    assert r.returncode == 2 and "[0, 1]" in r.stderr and "Traceback" not in r.stderr
    r = _run_cli("fit", str(tmp_path / "missing.csv"), "--x", "a", "--y", "b", check=False)
    assert r.returncode == 2 and "no such file" in r.stderr
    c, v = synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0)
    one = pd.DataFrame({"hours": c, "pass": v})
    pd.concat([one, one]).to_csv(csv, index=False)  # a file joined twice: every point would count double
    r = _run_cli("fit", str(csv), "--x", "hours", "--y", "pass", check=False)
    assert r.returncode == 2 and "appears more than once in one series" in r.stderr and "--seed-col" in r.stderr
    pd.concat([one.assign(seed=0), one.assign(seed=1)]).to_csv(csv, index=False)  # two seeds, said so: fitted
    assert _run_cli("fit", str(csv), "--x", "hours", "--y", "pass", "--seed-col", "seed", "--bootstrap", "0").stdout
    # PPO-off-policy-k generates a batch every k steps: evaluations between two batches share a compute
    ppo = one.assign(hours=np.where(np.arange(len(one)) % 3 == 1, one["hours"].shift(1), one["hours"]))
    ppo.to_csv(csv, index=False)
    assert _run_cli("fit", str(csv), "--x", "hours", "--y", "pass", "--bootstrap", "0").returncode == 0


def test_cli_compare(tmp_path):
    frames = []
    for name, (cm, b, a), seed in (("base", (2542, 2.0, 0.61), 1), ("variant", (2542, 1.2, 0.60), 2)):
        c, v = synthetic_curve(cm, b, a, c_max=16_000.0, seed=seed)
        frames.append(pd.DataFrame({"run": name, "h": c, "m": v}))
    csv = tmp_path / "cmp.csv"
    pd.concat(frames).to_csv(csv, index=False)
    out = _run_cli(
        "compare",
        str(csv),
        "--x",
        "h",
        "--y",
        "m",
        "--baseline",
        "base",
        "--exclude-below",
        "1500",
        "--cmid-grid",
        "paper",
        "--bootstrap",
        "0",  # the paper's rule alone, on the point estimates
        "--json",
        "-",
    )
    cmp = json.loads(out.stdout)["comparisons"]["variant"]
    assert cmp["rule"] == "B" and cmp["winner"] == "base"
    out = _run_cli(
        "compare", str(csv), "--x", "h", "--y", "m", "--baseline", "base", "--bootstrap", "200", "--json", "-"
    )
    cmp = json.loads(out.stdout)["comparisons"]["variant"]  # with forecasts: the same winner, or no winner and why
    assert cmp["winner"] == "base" or (cmp["winner"] == "undecided" and "not yet predictable" in cmp["verdict"])


def test_cli_fits_and_compares_with_the_model_it_is_given(tmp_path):
    """`--model` picks any fit model by its campaign name (default the sigmoid): the summary and the
    JSON name it, the parameters, bands and verdict are that model's (App. A.7: the power law's A
    overshoots a saturating run), and a name or a setting the model lacks is refused in one line."""
    from scalefit.models.registry import MODELS

    c, v = synthetic_curve(11272, 1.89, 0.645, c_max=50_000.0, seed=4)
    csv = tmp_path / "run.csv"
    pd.DataFrame({"hours": c, "pass": v}).to_csv(csv, index=False)
    common = ("fit", str(csv), "--x", "hours", "--y", "pass", "--exclude-below", "1500", "--json", "-")
    res = {}
    for model in MODELS:
        out = _run_cli(*common, "--model", model, "--bootstrap", "100")
        res[model] = json.loads(out.stdout)
        assert res[model]["model"] == model and f"run: {model}" in out.stderr  # the summary names it
        assert res[model]["verdict"]["label"] in ("predictable", "not yet predictable")
        assert all(f"  {p} " in out.stderr for p in MODELS[model].param_names)  # each parameter with its interval
    assert {"C_mid", "R0"} <= set(res["sigmoid"]) and "D" not in res["sigmoid"]
    assert "D" in res["power_law"] and "C_mid" not in res["power_law"]
    assert res["power_law"]["A"] > res["sigmoid"]["A"] + 0.05 and res["sigmoid"]["sse"] < res["power_law"]["sse"]
    assert json.loads(_run_cli(*common, "--bootstrap", "0").stdout)["model"] == "sigmoid"
    assert "{sigmoid,power_law}" in _run_cli("fit", "--help").stdout.replace(" ", "")
    bad = _run_cli(*common, "--model", "spline", check=False)
    assert bad.returncode == 2 and "invalid choice: 'spline'" in bad.stderr
    r0 = _run_cli(*common, "--model", "power_law", "--r0", "0.3", check=False)
    assert r0.returncode == 2 and "--r0" in r0.stderr and "power_law" in r0.stderr and "Traceback" not in r0.stderr
    frames = [pd.DataFrame({"run": "base", "h": c, "m": v})]
    frames.append(pd.DataFrame({"run": "worse", "h": c, "m": v - 0.08}))
    pd.concat(frames).to_csv(csv, index=False)
    out = _run_cli(
        "compare",
        str(csv),
        "--x",
        "h",
        "--y",
        "m",
        "--baseline",
        "base",
        "--model",
        "power_law",
        "--bootstrap",
        "0",
        "--exclude-below",
        "1500",
        "--json",
        "-",
    )
    cmp = json.loads(out.stdout)["comparisons"]["worse"]  # no asymptote: predicted values at the budget
    assert cmp["rule"] == "value" and cmp["winner"] == "base"


def test_sigmoid_is_r0_at_zero_and_a_at_infinity():
    assert sigmoid(0.0, 0.6, 2.0, 100.0, 0.2) == pytest.approx(0.2)
    assert sigmoid(1e12, 0.6, 2.0, 100.0, 0.2) == pytest.approx(0.6)
    assert sigmoid(100.0, 0.6, 2.0, 100.0, 0.2) == pytest.approx(0.4)


# --- #13: edges, memory, degenerate input ---------------------------------------------------


def test_compare_refuses_to_decide_when_both_fits_sit_on_the_a_grid_edge():
    """True asymptotes 0.95 and 0.84 both land on the default grid's top (0.800): no winner."""
    c1, v1 = synthetic_curve(2542, 1.92, 0.95, c_max=16_000.0, seed=1)
    c2, v2 = synthetic_curve(2542, 1.92, 0.84, c_max=16_000.0, seed=2)
    with pytest.warns(UserWarning):
        f1, f2 = (fit_sigmoid(c, v, cmid_grid=PAPER_CMID_GRID) for c, v in ((c1, v1), (c2, v2)))
    cmp = compare_fits(f1, f2, names=("base", "variant"))
    assert cmp.rule == "undecided" and cmp.winner == "undecided"
    assert cmp.verdict.startswith("cannot decide") and "edge of its grid" in cmp.verdict


def test_cli_compare_says_cannot_decide_at_the_grid_edge(tmp_path):
    frames = []
    for name, a, seed in (("base", 0.95, 1), ("variant", 0.84, 2)):
        c, v = synthetic_curve(2542, 1.92, a, c_max=16_000.0, seed=seed)
        frames.append(pd.DataFrame({"run": name, "h": c, "m": v}))
    csv = tmp_path / "edge.csv"
    pd.concat(frames).to_csv(csv, index=False)
    out = _run_cli(
        "compare", str(csv), "--x", "h", "--y", "m", "--baseline", "base", "--bootstrap", "100", "--json", "-"
    )
    cmp = json.loads(out.stdout)["comparisons"]["variant"]
    assert cmp["winner"] == "undecided" and "cannot decide" in out.stderr


def test_chunked_grid_gives_the_same_fit_with_bounded_memory(monkeypatch):
    import scalefit.models.sigmoid as fit_module

    c, v = synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0, n_points=400, seed=3)
    whole = fit_sigmoid(c, v, exclude_below=1500, cmid_grid=PAPER_CMID_GRID)
    monkeypatch.setattr(fit_module, "CHUNK_FLOATS", 20_000)  # ~2 points per grid chunk, a few cells per LM chunk
    chunked = fit_sigmoid(c, v, exclude_below=1500, cmid_grid=PAPER_CMID_GRID)
    assert (chunked.grid_A, chunked.grid_C_mid) == (whole.grid_A, whole.grid_C_mid)
    assert pytest.approx(whole.A, abs=1e-6) == chunked.A and chunked.sse == pytest.approx(whole.sse, rel=1e-6)


def test_points_that_all_share_one_compute_are_refused():
    with pytest.raises(FitError, match="same compute"):
        fit_sigmoid([0, 5, 5, 5, 5, 5], [0.3, 0.4, 0.5, 0.45, 0.5, 0.48])


@pytest.mark.parametrize("bad", ["-5", "3", "abc"])
def test_cli_rejects_a_bad_resample_count(tmp_path, bad):
    c, v = synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0)
    csv = tmp_path / "one.csv"
    pd.DataFrame({"h": c, "m": v}).to_csv(csv, index=False)
    r = _run_cli("fit", str(csv), "--x", "h", "--y", "m", "--bootstrap", bad, check=False)
    assert r.returncode == 2 and "--bootstrap" in r.stderr and "Traceback" not in r.stderr


def test_compare_names_the_run_that_cannot_be_fitted(tmp_path):
    c, v = synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0)
    frames = [pd.DataFrame({"run": "base", "h": c, "m": v}), pd.DataFrame({"run": "flat", "h": c, "m": 0.3})]
    csv = tmp_path / "flat.csv"
    pd.concat(frames).to_csv(csv, index=False)
    r = _run_cli("compare", str(csv), "--x", "h", "--y", "m", "--baseline", "base", check=False)
    assert r.returncode == 2 and "flat: no sigmoid gain" in r.stderr


def test_fit_of_several_curves_reports_each_and_fails_only_the_bad_one(tmp_path):
    """One flat curve among good ones: the good fits are printed, written and plotted, the flat one
    is named, and the exit code (2) says that not every curve was fitted."""
    frames = [pd.DataFrame({"run": "flat", "h": np.linspace(0, 16_000, 40), "m": 0.3})]
    for name, seed in (("base", 1), ("variant", 2)):
        c, v = synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0, seed=seed)
        frames.append(pd.DataFrame({"run": name, "h": c, "m": v}))
    csv, js, png = tmp_path / "three.csv", tmp_path / "fit.json", tmp_path / "fit.png"
    pd.concat(frames).to_csv(csv, index=False)
    r = _run_cli(
        "fit", str(csv), "--x", "h", "--y", "m", "--bootstrap", "0", "--json", str(js), "--plot", str(png), check=False
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "base: " in r.stdout and "variant: " in r.stdout and "A " in r.stdout  # both good fits reported
    assert "error: flat: no sigmoid gain" in r.stderr and "1 of 3 curves not fitted" in r.stderr
    res = json.loads(js.read_text())
    assert set(res["runs"]) == {"base", "variant"} and "flat" in res["failed"]
    assert png.stat().st_size > 10_000


def test_plot_draws_a_fit_on_a_grid_edge_as_points_only(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from scalefit.forecasts.plot import plot_fits

    c, v = synthetic_curve(2542, 1.92, 0.95, c_max=16_000.0, seed=1)
    with pytest.warns(UserWarning):
        edge = fit_sigmoid(c, v, cmid_grid=PAPER_CMID_GRID)  # A on the top of the default grid
    ok = fit_sigmoid(*synthetic_curve(2542, 1.92, 0.61, c_max=16_000.0, seed=2), cmid_grid=PAPER_CMID_GRID)
    saved = {}
    monkeypatch.setattr(plt, "close", lambda fig: saved.setdefault("fig", fig))
    flat_c = np.linspace(100.0, 16_000.0, 20)
    plot_fits({"edge": edge, "ok": ok}, tmp_path / "p.png", unfitted={"flat": (flat_c, np.full(20, 0.46))})
    ax = saved["fig"].axes[0]
    assert "flat: no fit" in ax.get_legend_handles_labels()[1]  # a curve with no fit is still drawn
    labels = [line.get_label() for line in ax.get_lines()]
    assert any(label.startswith("ok: A=") for label in labels)
    assert not any(label.startswith("edge: A=") for label in labels)  # no curve for the edge fit
    assert "edge: no identifiable fit (grid edge or bound)" in ax.get_legend_handles_labels()[1]
    assert ax.get_xscale() == "log"
    # legible at a glance: the legend beside the axes, not over the data; the y-range the data's
    fig = saved["fig"]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert ax.get_legend().get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1
    lo, hi = ax.get_ylim()
    values = np.concatenate([v, flat_c * 0 + 0.46])
    assert lo <= values.min() and hi >= 0.61 and hi - lo < 0.75  # not a fixed 0-1 axis
    markers = {tuple(c.get_paths()[0].vertices.round(3).ravel()) for c in ax.collections if len(c.get_offsets())}
    assert len(markers) >= 3  # each curve's points have their own marker


def test_b_never_leaves_its_range_and_a_fit_on_its_bound_says_so():
    """loo-gpu5's PPO-off-policy-8 (rises, then collapses): the winning cell's B was refined by an
    unbounded curve_fit to 77.5, outside the range (0.001, 50) that the warning then quoted."""
    from pathlib import Path

    from scalefit.models.sigmoid import B_BOUNDS

    curves = pd.read_csv(Path(__file__).resolve().parents[1] / "results/loo-gpu5/curves.csv")
    g = curves[curves["variant"] == "off_policy=ppo"]
    x, y = g["compute/samples"].to_numpy(), g["val/mean_at_16"].to_numpy()
    with pytest.warns(UserWarning, match="B = 50 is at a bound"):
        f = fit_sigmoid(
            x[x > 0],
            y[x > 0],
            r0=float(y[x == 0].mean()),
            runs=g["seed"].to_numpy()[x > 0],
            a_grid=np.arange(0.05, 1.0, 0.005),
        )
    assert B_BOUNDS[0] <= f.B <= B_BOUNDS[1] and f.b_at_bound


def test_a_fit_whose_reader_stops_early_ends_quietly(tmp_path):
    """`python -m scalefit fit … | head -1`: the reader closes the pipe; exit 141, no traceback."""
    csv = tmp_path / "curves.csv"
    table1_frame(c_max=16_000.0, n_points=41).query("run == 'ScaleRL'").to_csv(csv, index=False)
    read_end, write_end = os.pipe()
    os.close(read_end)  # a reader that already stopped: every write meets a closed pipe
    r = subprocess.run(
        [sys.executable, "-m", "scalefit", "fit", str(csv), "--x", "gpu_hours", "--y", "mean_at_16"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(write_end)
    assert r.returncode == 141 and "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr


def test_plot_draws_prediction_bands_only_for_forecasts_the_verdict_calls_predictable(tmp_path, monkeypatch):
    """loo-cpu's first fitted table: four not-yet-predictable variants' wide prediction bands laid
    over each other hid the data; a band is drawn where the verdict vouches for the forecast."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    from scalefit.forecasts.plot import plot_fits
    from scalefit.forecasts.single import forecast

    fits = {
        "long": fit_sigmoid(*synthetic_curve(2542, 1.92, 0.61, c_max=40_000.0, n_points=60, seed=3)),
        "short": fit_sigmoid(*synthetic_curve(2542, 1.92, 0.61, c_max=3_000.0, n_points=6, seed=4)),
    }
    fcs = {k: forecast(f, n_resamples=200, eval_prompts=1000) for k, f in fits.items()}
    called = {k: fc.verdict.predictable for k, fc in fcs.items()}
    assert called == {"long": True, "short": False}, called
    saved = {}
    monkeypatch.setattr(plt, "close", lambda fig: saved.setdefault("fig", fig))
    plot_fits(fits, tmp_path / "p.png", forecasts=fcs)
    ax = saved["fig"].axes[0]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection) and c.get_paths()]
    assert sorted(round(b.get_alpha(), 2) for b in bands) == [0.1, 0.25, 0.25]  # 1 prediction, 2 confidence
    assert "90% prediction band (an evaluation; predictable fits only)" in ax.get_legend_handles_labels()[1]


def test_a_refit_whose_optimum_sits_on_a_bound_reaches_it():
    """The profile over B refits (A, C_mid) at each fixed B inside the grid's ranges. Where the
    data's asymptote lies above A's range, the optimum is on A's bound: the batched
    Levenberg–Marquardt must reach it (as scipy's bounded least squares does), not crawl along
    the bound and stop short when its iterations run out (11% above the optimum's SSE, before)."""
    from scipy.optimize import least_squares

    from scalefit.models.curve import sigmoid_residuals
    from scalefit.models.lm import batched_lm

    rng = np.random.default_rng(1)
    c = np.geomspace(100, 20_000, 40)
    y = sigmoid(c, 0.9, 1.5, 3000.0, 0.1) + rng.normal(0, 0.01, len(c))
    bs = np.linspace(0.6, 3.0, 25)
    lower, upper = np.array([0.05, np.log(50.0)]), np.array([0.8, np.log(1e5)])  # A's range ends below 0.9

    def residuals(t: np.ndarray, rows: np.ndarray):
        full = np.column_stack([t[:, 0], bs[rows], t[:, 1]])
        return sigmoid_residuals(full, np.log(c)[None, :], y[None, :], 0.1, wrt=(0, 2))

    theta, sse = batched_lm(residuals, np.tile([0.5, np.log(1000.0)], (len(bs), 1)), lower, upper, iters=40)
    best = []
    for b in bs:
        fit = least_squares(
            lambda t, b=b: sigmoid(c, t[0], b, np.exp(t[1]), 0.1) - y,
            [0.5, np.log(1000.0)],
            bounds=(lower, upper),
            xtol=1e-14,
            ftol=1e-14,
            gtol=1e-14,
        )
        best.append(2 * fit.cost)
    assert (theta[:, 0] == 0.8).sum() >= 15  # most of the B values put A on its bound
    np.testing.assert_allclose(sse, best, rtol=1e-8)

"""The LOO table from curves: fits per variant (seeds pooled), the paper's rule, noise-aware verdicts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.loo import extrapolation_check, fit_table, load_curves, measured_at_budget, read_curves, to_markdown
from runners.campaign.spec import fit_settings as S  # a campaign's fit: section, parsed as load_campaign parses it
from runners.contract import MEAN_AT_16
from scalefit.data.synthetic import synthetic_curve
from scalefit.models.curve import sigmoid
from tests.conftest import ROOT, empty_store

X = "compute/gpu_hours"


def curves(spec: dict[str, tuple[float, float, float]], seeds=(0, 1), c_max=16_000.0) -> pd.DataFrame:
    rows = []
    for i, (variant, (cm, b, a)) in enumerate(spec.items()):
        for s in seeds:
            c, v = synthetic_curve(cm, b, a, c_max=c_max, n_points=81, seed=100 * i + s)
            rows.append(
                pd.DataFrame(
                    {
                        "variant": variant,
                        "axis": variant.split("=")[0],
                        "seed": s,
                        "step": range(len(c)),
                        "compute/gpu_hours": c,
                        "val/mean_at_16": v,
                    }
                )
            )
    return pd.concat(rows, ignore_index=True)


def test_loo_table_verdicts_follow_the_papers_rule():
    df = curves({"baseline": (2542, 1.92, 0.61), "loss=worse": (2542, 1.92, 0.52), "agg=same": (2542, 1.92, 0.61)})
    table, extra = fit_table(df, S({"x": X, "a_grid": "0.30:0.90:0.005", "exclude_below": 1500}), n_boot=200)
    t = table.set_index("variant")
    assert abs(t.loc["baseline", "A"] - 0.61) <= 0.015 and t.loc["baseline", "seeds"] == 2  # auto C_mid grid
    assert t.loc["baseline", "A_seed_half_range"] <= 0.02
    assert t.loc["loss=worse", "verdict"].startswith("worse asymptote")
    assert "not significant" not in t.loc["loss=worse", "verdict"]
    same = t.loc["agg=same", "verdict"]
    # the B values it quotes come from the refit at a shared A, not the table's B column: it says so
    assert same.startswith("no measurable difference") and re.search(r"refitted at shared A = 0\.6[01]", same)
    md = to_markdown(table)
    assert md.count("\n") == 2 + 2 + 3 and "| loss=worse |" in md and md.startswith("Fit: pooling partial")


def test_a_published_curves_csv_reads_back_as_the_store_gave_it(tmp_path):
    """`analysis fit --curves` fits a saved curves.csv as the campaign's store gave it (the baseline's
    empty axis stays "", not NaN) and names what a file that is not one lacks."""
    df = curves({"baseline": (2542, 1.92, 0.61), "loss=worse": (2542, 1.92, 0.52)})
    df["axis"] = df["axis"].where(df["variant"] != "baseline", "")
    df.insert(0, "run", df["variant"] + "/seed" + df["seed"].astype(str))
    path = tmp_path / "curves.csv"
    df.to_csv(path, index=False)
    fit = S({"x": X, "a_grid": "0.30:0.90:0.005"})
    back = read_curves(path, fit)
    assert back["axis"].tolist() == df["axis"].tolist()
    table, _ = fit_table(back, fit, n_boot=100)
    assert table.set_index("variant").loc["baseline", "axis"] == "—"
    with pytest.raises(ValueError, match=r"missing column\(s\) 'compute/samples'"):
        read_curves(path, S({"x": "compute/samples"}))
    with pytest.raises(ValueError, match="no such file"):
        read_curves(tmp_path / "nope.csv", fit)
    pd.concat([df, df]).to_csv(tmp_path / "twice.csv", index=False)  # every point would count double
    with pytest.raises(ValueError, match="'baseline/seed0' has step 0 more than once"):
        read_curves(tmp_path / "twice.csv", fit)
    other = df.assign(run=df["run"] + "-b")  # a second study's runs under the same seed numbers
    pd.concat([df, other]).to_csv(tmp_path / "pooled.csv", index=False)
    with pytest.raises(ValueError, match="need distinct seed numbers"):
        read_curves(tmp_path / "pooled.csv", fit)


@pytest.mark.slow
def test_runs_that_have_not_finished_are_named_in_the_table_and_by_the_command(tmp_path, cli):
    """`make fit` while a campaign runs (or after a run failed): the variant is fitted on the curves
    so far, and the table and the command say which have not finished, instead of passing a partial
    curve's last value off as its final one."""
    df = curves({"baseline": (2542, 1.92, 0.61), "loss=dapo": (2542, 1.92, 0.61)})
    df.insert(0, "run", df["variant"] + "/seed" + df["seed"].astype(str))
    cut = (df["run"] == "loss=dapo/seed1") & (df["step"] > 40)  # half-way through when read
    df = df[~cut].assign(done=lambda d: d["run"] != "loss=dapo/seed1", stopped="")
    path = tmp_path / "curves.csv"
    df.rename(columns={X: "compute/samples"}).to_csv(path, index=False)  # loo-cpu fits on compute/samples
    res = cli("analysis", "fit", "loo-cpu", "--curves", str(path), "--out", str(tmp_path / "fit"))
    assert res.returncode == 0, res.stderr
    assert "warning: 1 run(s) have not finished" in res.stderr
    t = pd.read_csv(tmp_path / "fit" / "loo_table.csv").set_index("variant")
    assert t.loc["loss=dapo", "unfinished"] == 1 and t.loc["baseline", "unfinished"] == 0
    md = (tmp_path / "fit" / "loo_table.md").read_text()
    assert "(1 of 2 runs unfinished)" in md.split("| loss=dapo |")[1].split("\n")[0]


def test_runs_of_another_version_of_the_campaign_are_never_pooled(tmp_path, store_template):
    """An edited campaign re-run into the same experiment leaves the old version's runs beside the
    new ones, under the same variant and seed: the fit takes the runs the campaign file names now
    and counts the others out; with neither version named, it refuses instead of pooling them."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from runners.contract import MEAN_AT_16
    from runners.tracking import store

    uri = empty_store(store_template, tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    exp = client.create_experiment("edited")
    for key, start, steps in (("v1", 1_000, 30), ("v2", 2_000, 40)):  # the budget was raised from 30 to 40 steps
        tags = {store.RUN_ID: key, store.VARIANT: "baseline", store.AXIS: "", store.SEED: "0", store.DONE: "1"}
        rid = client.create_run(exp, start_time=start, tags=tags, run_name="baseline/seed0").info.run_id
        points = [(s, 0.4 + s / 200) for s in range(0, steps + 1, 10)]
        client.log_batch(
            rid,
            metrics=[Metric(MEAN_AT_16, v, 0, s) for s, v in points]
            + [Metric("compute/samples", 128.0 * s, 0, s) for s, _ in points],
        )
    said: list[str] = []
    curves = load_curves("edited", uri, current={"v2"}, log=said.append)
    assert curves["step"].max() == 40 and curves["run_id"].nunique() == 1
    assert said and said[0].startswith("1 run(s) of another version of campaign edited")
    for current in (None, {"v3"}):  # nothing names a version (a notebook), or a store of older code
        with pytest.raises(ValueError, match="2 runs .* are all 'baseline' seed 0"):
            load_curves("edited", uri, current=current, log=said.append)


def test_unfittable_variant_is_reported_not_raised():
    df = curves({"baseline": (2542, 1.92, 0.61)})
    flat = df.copy()
    flat["variant"], flat["val/mean_at_16"] = "ppo=on", 0.30
    table, _ = fit_table(pd.concat([df, flat]), S({"x": X, "a_grid": "0.30:0.90:0.005"}), n_boot=100)
    note = table.set_index("variant").loc["ppo=on", "note"]
    assert "no sigmoid gain" in note


def test_a_seed_too_flat_to_fit_alone_keeps_its_variant_in_the_table():
    df = curves({"baseline": (2542, 1.92, 0.61), "think=short": (2542, 1.92, 0.50)})
    flat_seed = (df["variant"] == "think=short") & (df["seed"] == 1)
    df.loc[flat_seed, "val/mean_at_16"] = df.loc[flat_seed, "val/mean_at_16"].iloc[0]  # seed 1 never moves
    table, _ = fit_table(df, S({"x": X, "a_grid": "0.30:0.90:0.005"}), n_boot=100)
    row = table.set_index("variant").loc["think=short"]
    assert np.isfinite(row["A"]) and "no per-seed A spread: no sigmoid gain" in row["note"]


def test_loo_verdict_cannot_decide_at_the_grid_edge_or_when_not_predictable():
    df = curves({"baseline": (2542, 1.92, 0.61), "edge=up": (2542, 1.92, 0.95)})
    early = curves({"early=stop": (9000, 1.92, 0.70)}, c_max=4_000.0)  # stopped long before its knee
    early["variant"] = "early=stop"
    table, _ = fit_table(pd.concat([df, early]), S({"x": X, "a_grid": "0.30:0.90:0.005"}), n_boot=100)
    t = table.set_index("variant")
    assert t.loc["edge=up", "verdict"].startswith("cannot decide") and "edge of its grid" in t.loc["edge=up", "verdict"]
    assert t.loc["early=stop", "verdict"].startswith("cannot decide")
    assert "not yet predictable" in t.loc["early=stop", "verdict"]
    assert not t.loc["early=stop", "predictable"]
    assert "(grid edge)" in to_markdown(table)


def test_identical_curves_are_flagged_not_judged():
    df = curves({"baseline": (2542, 1.92, 0.61)})
    twin = df.copy()
    twin["variant"], twin["axis"] = "fp32=off", "fp32"
    twin[X] = twin[X] * 1.7  # same learning curve, a slower machine
    table, _ = fit_table(pd.concat([df, twin]), S({"x": X, "a_grid": "0.30:0.90:0.005"}), n_boot=100)
    row = table.set_index("variant").loc["fp32=off"]
    assert row["identical_to_baseline"] and row["verdict"].startswith("identical mean@16 to the baseline")


def test_extrapolation_check_predicts_a_clean_curve_from_its_first_half_only():
    df = curves({"baseline": (2542, 1.92, 0.61)}, c_max=32_000.0)
    fit = S({"x": X, "a_grid": "0.30:0.90:0.005", "level": 0.9})
    ex = extrapolation_check(df, fit, n_boot=100).iloc[0]
    truth = float(sigmoid(np.array([32_000.0]), 0.61, 1.92, 2542, 0.30)[0])
    assert abs(ex["predicted"] - truth) <= 0.02 and ex["band_lo"] <= truth <= ex["band_hi"]
    assert ex["level"] == 0.9 and 0 <= ex["expected_error"] < 0.05
    # what lies past half the compute is only observed, never fitted: wreck it and the prediction stays
    tampered = df.copy()
    tampered.loc[tampered[X] > ex["fit_upto"], "val/mean_at_16"] = 0.05
    ex2 = extrapolation_check(tampered, fit, n_boot=100).iloc[0]
    assert (ex2["predicted"], ex2["band_lo"], ex2["band_hi"]) == (ex["predicted"], ex["band_lo"], ex["band_hi"])
    assert ex2["observed"] == pytest.approx(0.05) and not ex2["in_band"] and ex["in_band"]
    assert ex["fit_share"] == 0.5 and ex["fit_upto"] == pytest.approx(0.5 * df[X].max())  # the paper's half


def test_extrapolation_check_with_few_evaluations_fits_the_share_that_holds_a_fit():
    """7 evaluations (as loo-cpu's 30 steps, one every 5): the first half holds 3 past zero, a fit
    needs 4, so the check fits the first two thirds and predicts the last; with 4 past zero there
    is nothing left to predict, and the row says why."""
    df = curves({"baseline": (2542, 1.92, 0.61)}, seeds=(0,))
    seven = df[df["step"] % 13 == 0].head(7)
    assert (seven[X] > 0).sum() == 6
    ex = extrapolation_check(seven, S({"x": X, "a_grid": "0.30:0.90:0.005"}), n_boot=50).iloc[0]
    assert ex["fit_share"] == pytest.approx(seven[X].iloc[4] / seven[X].iloc[-1])  # the 4th point past zero
    assert np.isfinite(ex["predicted"]) and ex["band_lo"] <= ex["predicted"] <= ex["band_hi"]
    few = extrapolation_check(seven.head(5), S({"x": X, "a_grid": "0.30:0.90:0.005"}), n_boot=50).iloc[0]
    assert "no check: 4 evaluation(s)" in few["note"] and pd.isna(few["fit_share"])


def test_unknown_fit_key_is_refused_with_a_suggestion():
    df = curves({"baseline": (2542, 1.92, 0.61)})
    with pytest.raises(ValueError, match="did you mean 'fit.margin'"):
        fit_table(df, S({"x": X, "margn": 0.02}))  # refused where the campaign loads: S is fit_settings


# --- run reports: anomaly detection on known series ---------------------------------------


def test_anomaly_detectors_find_what_was_planted_and_nothing_else():

    from analysis.report import find_anomalies

    steps = range(1, 61)
    rng = np.random.default_rng(0)
    reward = pd.Series(0.3 + 0.005 * np.arange(60) + rng.normal(0, 0.01, 60), index=steps)
    clean = {
        "train/reward": reward,
        "train/entropy": pd.Series(np.linspace(0.9, 0.5, 60), index=steps),
        "train/completions/clipped_ratio": pd.Series(0.02, index=steps),
        "val/mean_at_16": pd.Series([0.40, 0.45, 0.50, 0.52, 0.53], index=[0, 15, 30, 45, 60]),
        "train/nonfinite_values": pd.Series(0.0, index=steps),
    }
    assert find_anomalies(clean, n_val_prompts=1000) == []

    bad = dict(clean)
    bad["train/reward"] = reward.copy()
    bad["train/reward"][30] -= 0.4  # a dip
    bad["train/completions/clipped_ratio"] = pd.Series([0.02] * 40 + [0.25] * 20, index=steps)
    bad["train/entropy"] = pd.Series(np.r_[np.linspace(0.9, 0.5, 50), [0.05] * 10], index=steps)
    bad["val/mean_at_16"] = pd.Series([0.40, 0.45, 0.50, 0.38, 0.53], index=[0, 15, 30, 45, 60])
    bad["train/nonfinite_values"] = pd.Series([0.0] * 55 + [1.0] * 5, index=steps)
    found = {f.kind: f.text for f in find_anomalies(bad, n_val_prompts=1000)}
    assert found.keys() == {"reward dip", "truncation", "entropy collapse", "validation regression", "NaN/inf"}
    assert found["reward dip"].startswith("step 30:")
    assert "steps 41–60" in found["truncation"] and "25%" in found["truncation"]
    assert "step 51" in found["entropy collapse"]
    assert found["validation regression"].startswith("step 45: mean@16 0.380, 0.120 below")
    assert "56–60" in found["NaN/inf"]


def test_report_cli_names_a_missing_run_and_a_missing_store(tmp_path, cli, store_template):
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    def report(uri: str, ref: str = "nosuch/seed0") -> subprocess.CompletedProcess:
        return cli("analysis", "report", ref, "--tracking-uri", uri)

    # a mistyped store path: said so, and no empty store is left there (MLflow would create one);
    # from the shell, for the real process's exit code and stderr
    typo = f"sqlite:///{tmp_path}/typo.db"
    res = subprocess.run(
        [sys.executable, "-m", "analysis", "report", "nosuch/seed0", "--tracking-uri", typo],
        capture_output=True,
        text=True,
    )
    assert "Traceback" not in res.stderr
    assert res.returncode == 2 and f"no MLflow store at {tmp_path}/typo.db" in res.stderr
    assert not (tmp_path / "typo.db").exists()
    empty_store(store_template, tmp_path / "m.db")  # an MLflow store without that run
    res = report(f"sqlite:///{tmp_path}/m.db")
    assert res.returncode == 2 and "no run with id or name 'nosuch/seed0'" in res.stderr
    assert "it holds no runs yet" in res.stderr
    # a name that is not a run's (a variant, as `make report RUN=baseline`): the names there are, closest first
    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    exp = client.create_experiment("loo-x")
    for name in ("baseline/seed0", "baseline/seed1", "loss=dapo/seed0"):
        client.create_run(exp, run_name=name, tags={"prl.run_id": name})
    res = report(f"sqlite:///{tmp_path}/m.db", "baseline")
    assert res.returncode == 2 and "did you mean baseline/seed0 or baseline/seed1?" in res.stderr
    assert "Runs there: baseline/seed0, baseline/seed1, loss=dapo/seed0" in res.stderr


def test_a_spliced_run_whose_compute_goes_backwards_is_not_fitted():
    df = curves({"baseline": (2542, 1.92, 0.61), "fp32=off": (2542, 1.92, 0.61)})
    bad = (df["variant"] == "fp32=off") & (df["seed"] == 1) & (df["step"] >= 40)
    df.loc[bad, X] = df.loc[bad, X] - 9000.0  # a restart from step 0 logged into the same run
    table, extra = fit_table(df, S({"x": X, "a_grid": "0.30:0.90:0.005"}), n_boot=100)
    note = table.set_index("variant").loc["fp32=off", "note"]
    assert "goes backwards" in note and "seed 1" in note and "fp32=off" not in extra["fits"]


RECORDED = Path(__file__).resolve().parents[1] / "results" / "loo-cpu100" / "curves.csv"  # R0 shared by 5 variants


def _planted(curves: pd.DataFrame) -> pd.DataFrame:
    """loo-cpu's recorded curves with two bad points: a NaN mean@16 at step 0 of one baseline seed, and a
    negative compute at step 15 of zero_variance=off."""
    bad = curves.copy()
    bad.loc[(bad["variant"] == "baseline") & (bad["seed"] == 0) & (bad["step"] == 0), MEAN_AT_16] = np.nan
    bad.loc[(bad["variant"] == "zero_variance=off") & (bad["step"] == 15), "compute/samples"] = -5.0
    return bad


def test_one_bad_point_is_left_out_by_name_and_spoils_no_other_curve():
    """Issue 42, item 4: a NaN mean@16 at step 0 of one baseline seed made the campaign's shared R0 NaN, so
    every variant got "no fit: r0 must lie in [0, 1], got nan"; a negative compute was blamed on two runs
    spliced. Each bad point is left out by name (run, step, value): what the clean file fits still fits."""
    from runners.campaign.load import load_campaign

    fit = load_campaign("loo-cpu").fit
    clean = read_curves(RECORDED, fit)
    t = fit_table(_planted(clean), fit, n_boot=50)[0].set_index("variant")
    c = fit_table(clean, fit, n_boot=50)[0].set_index("variant")
    unfit = {v: n for v, n in t["note"].items() if n.startswith("no fit")}  # before: "r0 ... got nan" in all
    assert list(unfit) == ["control=think_6"], unfit  # one bad point spoils no curve: as in the clean file
    assert t["A"].notna().to_dict() == c["A"].notna().to_dict() and t["A"].notna().sum() == 4
    assert (t["A"] - c["A"]).abs().max() < 0.05  # one point fewer, not another fit
    assert t.loc["baseline", "note"].endswith(
        "1 bad point(s) left out: baseline/seed0 step 0: val/mean_at_16 = nan is not a pass rate in [0, 1]"
    )
    note = t.loc["zero_variance=off", "note"]
    assert "zero_variance=off/seed0 step 15: compute/samples = -5 is negative" in note and "spliced" not in note
    md = to_markdown(t.reset_index())
    assert "(1 bad point(s) left out: baseline/seed0 step 0" in md.split("| baseline |")[1].split("\n")[0]


def test_a_curve_with_every_point_bad_is_named_and_the_others_fit():
    df = curves({"baseline": (2542, 1.92, 0.61), "lr=nan": (2542, 1.92, 0.61)})
    df.loc[df["variant"] == "lr=nan", MEAN_AT_16] = np.nan
    t = fit_table(df, S({"x": X, "a_grid": "0.30:0.90:0.005"}), n_boot=50)[0].set_index("variant")
    assert not np.isnan(t.loc["baseline", "A"])
    assert t.loc["lr=nan", "note"].startswith("no fit: every point is bad; 162 bad point(s) left out: lr=nan/seed0")
    with pytest.raises(ValueError, match="no evaluation to fit: every point is bad"):
        fit_table(df[df["variant"] == "lr=nan"], S({"x": X}), n_boot=50)


def test_a_curves_file_without_rows_is_one_line(tmp_path, cli):
    """A header-only curves.csv gave `KeyError: 'variant'`; an empty one, pandas' words without the file's name."""
    (tmp_path / "header.csv").write_text(RECORDED.read_text().splitlines()[0] + "\n")
    (tmp_path / "empty.csv").write_text("")
    for name, line in (("header", "a header and no rows: no evaluation to fit"), ("empty", "an empty file")):
        r = cli("analysis", "fit", "loo-cpu", "--curves", str(tmp_path / f"{name}.csv"), "--out", str(tmp_path))
        assert r.returncode == 2 and r.stderr.startswith(f"error: {tmp_path / name}.csv: {line}"), r.stderr
        assert len(r.stderr.splitlines()) == 1 and not (tmp_path / "loo_table.csv").exists()


def test_a_curves_file_cut_short_is_one_line_saying_it_ends_mid_row(tmp_path, cli):
    """Issue 60, item 8: a curves.csv cut mid-row read as "1 bad point left out" (cut after a mean@16:
    the row's compute NaN), as "runs of different studies" (cut inside its run id) or as a wrong number
    (cut inside the last value); each is now the one line that says the file ends mid-row."""
    text = RECORDED.read_bytes()
    last = text.rstrip(b"\n").rsplit(b"\n", 1)[1].decode()
    head = text[: len(text) - len(last) - 1]
    cells = last.split(",")
    run_id = ",".join(cells[:-2])  # ...,RUN_ID: the last row cut inside its run id
    for cut in (",".join(cells[:6]), run_id[:-9], ",".join(cells[:-4])[:-3]):  # after mean@16, in the id, in a number
        path = tmp_path / "cut.csv"
        path.write_bytes(head + cut.encode())
        with pytest.raises(ValueError, match=r"the file ends mid-row \(line \d+, .* has no line end\): it was cut"):
            read_curves(path, S({"x": "compute/samples"}))
    r = cli("analysis", "fit", "loo-cpu", "--curves", str(path), "--out", str(tmp_path / "fit"))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and not (tmp_path / "fit").exists()
    lines = text.count(b"\n")  # the cut row is the file's last line
    assert r.stderr.startswith(f"error: {path}: the file ends mid-row (line {lines}, "), r.stderr


@pytest.mark.slow
def test_analysis_fit_warns_of_each_bad_point_it_left_out(tmp_path, cli):
    """`analysis fit --curves` with a NaN and a negative compute: the fit ends (exit 0) with a warning line
    naming each variant's bad points, and every variant the clean file fits is fitted."""
    path = tmp_path / "curves.csv"
    _planted(pd.read_csv(RECORDED)).to_csv(path, index=False)
    r = cli("analysis", "fit", "loo-cpu", "--curves", str(path), "--out", str(tmp_path / "fit"))
    assert r.returncode == 0, r.stderr
    warned = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert warned == [
        "warning: baseline: 1 bad point(s) left out: baseline/seed0 step 0: val/mean_at_16 = nan is not a pass "
        "rate in [0, 1]",
        "warning: zero_variance=off: 1 bad point(s) left out: zero_variance=off/seed0 step 15: compute/samples = -5 "
        "is negative: compute spent starts at 0 and only grows",
    ]
    assert pd.read_csv(tmp_path / "fit" / "loo_table.csv")["A"].notna().sum() == 4


def test_a_nan_logged_to_mlflow_is_named_not_dropped_in_silence(tmp_path, store_template):
    """A NaN mean@16 logged to the store reaches the fit, which names it (``bad_points``); a step where
    only compute was logged is no evaluation."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from runners.tracking import store

    uri = empty_store(store_template, tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    exp = client.create_experiment("nan")
    tags = {store.RUN_ID: "k", store.VARIANT: "baseline", store.AXIS: "", store.SEED: "0", store.DONE: "1"}
    rid = client.create_run(exp, tags=tags, run_name="baseline/seed0").info.run_id
    values = {0: float("nan"), 10: 0.5, 20: 0.6}
    client.log_batch(
        rid,
        metrics=[Metric(MEAN_AT_16, v, 0, s) for s, v in values.items()]
        + [Metric("compute/samples", 128.0 * s, 0, s) for s in (0, 5, 10, 20)],
    )
    got = load_curves("nan", uri)
    assert got["step"].tolist() == [0, 10, 20]
    from analysis.loo import bad_points

    (why,) = bad_points(got, "compute/samples")[1]["why"]
    assert why == "baseline/seed0 step 0: val/mean_at_16 = nan is not a pass rate in [0, 1]"


def test_run_report_flags_compute_that_goes_backwards():
    from analysis.report import find_anomalies

    h = {"compute/gpu_hours": pd.Series([0.0, 14.6, 8.4, 9.0], index=[0, 38, 40, 42])}
    (finding,) = find_anomalies(h)
    assert finding.kind == "compute goes backwards" and "14.6 at step 38" in finding.text


def test_fitting_against_wall_clock_warns_about_shared_machines():
    df = curves({"baseline": (2542, 1.92, 0.61)})
    with pytest.warns(UserWarning, match="wall-clock time: on a shared or loaded machine"):
        fit_table(df, S({"x": X, "a_grid": "0.30:0.90:0.005"}), n_boot=50)


def test_measured_at_the_budget_separates_what_the_seeds_resolve():
    df = curves(
        {"baseline": (2542, 1.92, 0.61), "lr=slow": (2542, 1.92, 0.50), "agg=same": (2542, 1.92, 0.61)}, seeds=(0, 1, 2)
    )
    m = measured_at_budget(df, X, margin=0.02).set_index("variant")
    slow = m.loc["lr=slow"]
    assert slow["measured"].startswith("worse") and slow["measured_hi"] < -0.02
    assert slow["measured_lo"] <= -0.105 <= slow["measured_hi"]  # the planted difference at 16k (0.61 - 0.50, ~97%)
    same = m.loc["agg=same"]
    assert same["measured_lo"] <= 0.0 <= same["measured_hi"] and not same["measured"].startswith(("worse", "better"))
    # a variant whose budget ends earlier (PPO-off-policy at equal samples) is compared where both were measured
    short = curves({"ppo=on": (2542, 1.92, 0.61)}, c_max=8_000.0)
    both = measured_at_budget(pd.concat([df, short]), X, margin=0.02).set_index("variant")
    assert both.loc["ppo=on", "budget"] == pytest.approx(8_000.0, rel=0.01)
    assert "at 8e+03 gpu_hours" in both.loc["ppo=on", "measured"]
    # one seed each: no interval is claimed
    one = measured_at_budget(df[df["seed"] == 0], X, margin=0.02)
    assert one["measured"].str.startswith("one seed each").all() and one["measured_lo"].isna().all()
    # and the LOO table carries it
    table, _ = fit_table(df, S({"x": X, "a_grid": "0.30:0.90:0.005"}), n_boot=100)
    assert table.set_index("variant").loc["lr=slow", "measured"].startswith("worse")
    assert "measured at the budget" in to_markdown(table)


def test_the_measured_seed_noise_is_pooled_over_arms_with_a_fit_only():
    """An arm no curve holds (here its runs spliced into one history each: no fit) with seeds far
    apart does not set the others' measured intervals: the seed sd is pooled over fitted arms. Its
    own row is still measured, on that sd. Before, one classical sd over every arm widened them all."""
    spec = {"baseline": (2542, 1.92, 0.61), "lr=slow": (2542, 1.92, 0.50), "agg=same": (2542, 1.92, 0.61)}
    df = curves(spec, seeds=(0, 1, 2))
    broken = curves({"broken": (2542, 1.92, 0.45)}, seeds=(0, 1, 2))
    broken[MEAN_AT_16] += broken["seed"].map({0: -0.2, 1: 0.0, 2: 0.2})  # seeds far apart
    swap = broken["step"].isin([40, 41])  # compute goes backwards once in each seed: spliced
    broken.loc[swap, X] = broken.loc[swap].groupby("seed")[X].transform(lambda c: c.to_numpy()[::-1])
    fit = S({"x": X, "a_grid": "0.30:0.90:0.005"})
    clean = fit_table(df, fit, n_boot=50)[0].set_index("variant")
    table = fit_table(pd.concat([df, broken], ignore_index=True), fit, n_boot=50)[0].set_index("variant")
    assert table.loc["broken", "note"].startswith("no fit: seed 0: compute/gpu_hours goes backwards")
    for v in ("lr=slow", "agg=same"):
        for c in ("measured_last3_lo", "measured_last3_hi", "half_measured_last3_lo", "measured_hi"):
            assert table.loc[v, c] == pytest.approx(clean.loc[v, c], abs=1e-12), (v, c)
    d = table.loc["broken"]  # its own comparison, on the fitted arms' sd: as narrow as theirs
    width = clean.loc["agg=same", "measured_last3_hi"] - clean.loc["agg=same", "measured_last3_lo"]
    assert d["measured_last3_hi"] - d["measured_last3_lo"] == pytest.approx(width, rel=1e-9)


def test_measured_at_half_the_budget_shows_an_efficiency_difference_the_budget_hides():
    """A slower learner that reaches the same plateau (a later C_mid) is behind at half the budget,
    where the seeds resolve it, and within reach of the baseline by the end."""
    df = curves({"baseline": (2542, 1.92, 0.61), "lr=half": (10_000, 1.92, 0.61)}, seeds=(0, 1, 2), c_max=40_000.0)
    full = measured_at_budget(df, X, margin=0.02).set_index("variant").loc["lr=half"]
    half = measured_at_budget(df, X, margin=0.02, fraction=0.5).set_index("variant").loc["lr=half"]
    assert half["budget"] == pytest.approx(20_000.0, rel=0.01)
    assert half["measured"].startswith("worse") and half["measured_hi"] < -0.02
    assert full["measured_delta"] > half["measured_delta"] + 0.02
    table, _ = fit_table(df, S({"x": X, "a_grid": "0.30:0.90:0.005"}), n_boot=100)
    assert table.set_index("variant").loc["lr=half", "half_measured"].startswith("worse")
    assert "| measured at half the budget |" in to_markdown(table)


def test_mechanism_table_says_which_axis_acted(tmp_path, store_template):
    """From a real MLflow store: a variant acts when a metric of the recipe setting it changes (by
    recipe key, whatever its campaign calls the axis) leaves the baseline's seed range,
    or appears or vanishes with a non-zero value; one whose metric stays inside it, is logged only
    as 0 (a clip that never fired: the CPU default's DAPO), or whose mean@16 equals the baseline's
    at every step did not act. A run without recipe params, or a variant with the baseline's recipe,
    is unknown, not a control."""
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    from analysis.evidence import acted, mechanism_runs, to_markdown

    client = MlflowClient(empty_store(store_template, tmp_path / "mlflow.db"))
    exp = client.create_experiment("evidence")
    logged = {  # variant/seed → {metric: per-step values}
        ("baseline", 0): {"sampling/sampling_logp_difference/mean": [2.0e-4, 2.2e-4], "cispo_clip_ratio": [0.0, 0.0]},
        ("baseline", 1): {"sampling/sampling_logp_difference/mean": [2.3e-4, 2.1e-4], "cispo_clip_ratio": [0.0, 0.0]},
        ("fp32=off", 0): {"sampling/sampling_logp_difference/mean": [2.8e-4, 2.6e-4]},
        ("fp32=off", 1): {"sampling/sampling_logp_difference/mean": [2.7e-4, 2.7e-4]},
        ("fp32=same", 0): {"sampling/sampling_logp_difference/mean": [2.1e-4, 2.2e-4]},
        ("loss=dapo", 0): {"clip_ratio/region_mean": [0.004, 0.006]},
        ("loss=gspo", 0): {"clip_ratio/region_mean": [0.0, 0.0]},
        ("sampling=uniform", 0): {},
        ("aggregation=sample", 0): {},
    }
    baseline = {  # each run logs its recipe as params; a variant changes one key (a control, several)
        "algorithm.loss": "cispo",
        "algorithm.fp32_lm_head": "True",
        "algorithm.sampling": "no_positive_resampling",
        "algorithm.aggregation": "prompt",
        "optim.lr": "0.0003",
    }
    changes = {
        "fp32=off": {"algorithm.fp32_lm_head": "False"},
        "fp32=same": {"algorithm.fp32_lm_head": "False"},
        "loss=dapo": {"algorithm.loss": "dapo"},
        "loss=gspo": {"algorithm.loss": "gspo"},
        "sampling=uniform": {"algorithm.sampling": "uniform"},
        "aggregation=sample": {"algorithm.aggregation": "sample"},
        "renamed=dapo": {"algorithm.loss": "dapo"},  # an axis its campaign calls 'renamed': still the loss's
        "control=lr": {"optim.lr": "0.00015"},
        # a run of newer code logs settings the baseline's did not know (SAPO's, at their defaults)
        "loss=sapo": {"algorithm.loss": "sapo", "algorithm.sapo_temperature_pos": "1.0"},
    }
    logged[("renamed=dapo", 0)] = {"clip_ratio/region_mean": [0.004, 0.006]}
    logged[("control=lr", 0)] = {"clip_ratio/region_mean": [0.0, 0.0]}
    logged[("imported=old", 0)] = {"clip_ratio/region_mean": [0.004, 0.006]}  # a run that logged no recipe
    logged[("same=recipe", 0)] = {}
    logged[("loss=sapo", 0)] = {}
    rows = []
    for (variant, seed), metrics in logged.items():
        run = client.create_run(exp).info.run_id
        params = {**baseline, **changes.get(variant, {}), "train.seed": str(seed), "name": f"evidence/{variant}"}
        if variant != "imported=old":
            client.log_batch(run, params=[Param(k, v) for k, v in params.items()])
        for name, values in metrics.items():
            for step, v in enumerate(values):
                client.log_metric(run, f"train/{name}", v, step=step)
        if variant.startswith("baseline"):
            client.log_metric(run, "train/npr/dropped_prompts", 9.0, step=1)  # retired, never redrawn
        axis = variant.split("=")[0] if "=" in variant else None
        rows.append({"run_id": run, "variant": variant, "axis": axis, "seed": seed})
    runs = mechanism_runs(pd.DataFrame(rows), client)
    assert runs.set_index("variant").loc["loss=sapo", "keys"] == {"algorithm.loss"}  # not a control
    table = acted(runs, identical={"sampling=uniform"}).set_index("variant")
    assert table.loc["fp32=off", "acted"].startswith("acted: logp mismatch")
    assert table.loc["fp32=same", "acted"].startswith("did not act")
    assert table.loc["loss=dapo", "acted"] == "acted: clipped (DAPO/GSPO) — → 0.005"  # CISPO's 0 → —: never fired
    assert table.loc["loss=gspo", "acted"].startswith("did not act")  # switched on, but 0: never clipped
    assert table.loc["sampling=uniform", "acted"] == "did not act: mean@16 identical to the baseline's at every step"
    assert acted(runs).set_index("variant").loc["sampling=uniform", "acted"].startswith("acted: NPR dropped 9")
    assert table.loc["aggregation=sample", "acted"].startswith("no mechanism metric")
    assert table.loc["renamed=dapo", "acted"] == table.loc["loss=dapo", "acted"]  # judged by its recipe key
    assert table.loc["control=lr", "acted"] == "control: see every column"
    assert table.loc["imported=old", "acted"].startswith("unknown: a run of this variant or of the baseline logged no")
    assert table.loc["same=recipe", "acted"] == "unknown: its recipe equals the baseline's (it changes no setting)"
    assert table.loc["baseline", "logp mismatch"] == pytest.approx(2.15e-4)
    assert "| fp32=off |" in to_markdown(table.reset_index())


@pytest.mark.slow
def test_make_lab_serves_the_notebook_on_localhost_with_a_token_over_the_projects_store():
    """``make lab``: a real JupyterLab on 127.0.0.1, token required, the LOO notebook in it, and the
    project's MLflow store (not the notebook folder's) in the environment its kernels inherit."""
    import os
    import re
    import signal
    import subprocess
    import time
    import urllib.error
    import urllib.request
    from pathlib import Path

    import psutil

    from runners.tracking.server_processes import free_port

    root = Path(__file__).resolve().parent.parent
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    lab = subprocess.Popen(
        ["make", "-s", "lab", f"LAB_PORT={port}", "CAMPAIGN=nb-campaign"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        token, seen, deadline = None, [], time.time() + 120
        while token is None and time.time() < deadline and lab.poll() is None:
            line = lab.stdout.readline()
            seen.append(line)
            m = re.search(rf"http://127\.0\.0\.1:{port}/lab\?token=(\w+)", line)
            token = m.group(1) if m else None
        assert token, "".join(seen[-20:])
        url = f"http://127.0.0.1:{port}/api/contents/analysis/loo.ipynb?content=0"
        code = None  # the address is printed a moment before the socket accepts
        while code is None and time.time() < deadline:
            try:
                urllib.request.urlopen(url, timeout=10)
                code = 200
            except urllib.error.HTTPError as e:
                code = e.code
            except urllib.error.URLError:
                time.sleep(0.5)
        assert code == 403  # no token, no notebook
        req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200 and '"name": "loo.ipynb"' in r.read().decode().replace('":"', '": "')
        server = next(  # the process that listens on the port
            p
            for p in psutil.Process(lab.pid).children(recursive=True)
            if any(c.laddr.port == port and c.status == "LISTEN" for c in p.net_connections("tcp"))
        )
        server_env = server.environ()
        assert server_env["MLFLOW_TRACKING_URI"] == f"sqlite:///{root}/mlflow.db"
        assert server_env["PRL_CAMPAIGN"] == "nb-campaign"
        assert all(c.laddr.ip == "127.0.0.1" for c in server.net_connections("tcp") if c.status == "LISTEN")
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=30)


FIT_AND_SAY_WHAT_IT_LOADED = """
import sys
from analysis.cli import main
code = main(["fit", "loo-cpu", "--curves", sys.argv[1], "--out", sys.argv[2]])
print(sorted(m for m in sys.modules if m.split(".")[0] == "mlflow")[:3])
sys.exit(code)
"""


def test_a_fit_of_a_curves_csv_does_not_import_mlflow(tmp_path):
    """`analysis fit --curves` reads no store, so it loads no MLflow: importing it was ~1.5 s of CPU of
    the fit of loo-gpu6 (`make bench-analysis`, docs/benchmarks.md). A fresh process says what it loaded."""
    df = curves({"baseline": (2542, 1.92, 0.61), "loss=dapo": (2542, 1.92, 0.61)})
    df.insert(0, "run", df["variant"] + "/seed" + df["seed"].astype(str))
    path = tmp_path / "curves.csv"
    df.rename(columns={X: "compute/samples"}).to_csv(path, index=False)  # loo-cpu fits on compute/samples
    args = [sys.executable, "-c", FIT_AND_SAY_WHAT_IT_LOADED, str(path), str(tmp_path / "fit")]
    res = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "fit" / "loo_table.md").is_file()
    assert res.stdout.splitlines()[-1] == "[]", res.stdout.splitlines()[-1]

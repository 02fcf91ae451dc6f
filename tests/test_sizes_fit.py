"""scalefit.sizes: the across-size fit on synthetic sizes of known laws (recovered, the largest forecast
within its band, a wrong form rejected by held-out error), its backtest, command line and bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scalefit.cli import main
from scalefit.data.synthetic import size_runs
from scalefit.errors import FitError
from scalefit.models.curve import sigmoid
from scalefit.sizes import backtest_sizes, choose_forms, fit_size, forecast_lines, forecast_size, size_data
from scalefit.sizes.data import reach_text

ROOT = Path(__file__).resolve().parents[1]
N = {"a": 0.46e6, "b": 1.67e6, "c": 5.3e6, "d": 14.2e6, "e": 25.8e6}


def A_of(n):
    return 0.95 - 0.9 * (n / 1e5) ** -0.35  # saturating: 0.42 at 0.46M, 0.82 at 25.8M


def cmid_of(n):
    return 3e4 * (n / 1e6) ** 0.3  # a power law: larger models take longer to reach their midpoint


def r0_of(n):
    return 0.3 + 0.03 * np.log(n / 1e5)


def runs(sizes=N, seeds: int = 3, seed: int = 1, **laws) -> pd.DataFrame:
    f = {"A_of": A_of, "cmid_of": cmid_of, "b_of": lambda n: 1.8, "r0_of": r0_of, **laws}
    return size_runs(sizes, seeds=seeds, seed=seed, c_max=153_600, n_points=31, n_prompts=300, **f)


def as_data(df: pd.DataFrame):
    return size_data({k: (g.parameters.iloc[0], g.compute, g.value, g.seed) for k, g in df.groupby("size")})


def test_known_laws_are_recovered_and_the_largest_size_is_forecast_within_its_band():
    data = as_data(runs())
    for name, d in data.items():
        f = fit_size(name, d)
        assert abs(f.theta["A"] - A_of(d.params)) < 0.02, (name, f.theta)
    fc = forecast_size(data, "e")
    truth_a = A_of(N["e"])
    lo, hi = fc.interval("A")
    assert lo <= truth_a <= hi and abs(fc.A - truth_a) <= 0.03, (fc.A, lo, hi)
    assert fc.choice.forms["A"] == "saturating" and fc.choice.forms["logC"] == "log-linear"
    truth = sigmoid(fc.compute, truth_a, 1.8, cmid_of(N["e"]), r0_of(N["e"]))
    assert np.mean((truth >= fc.lo) & (truth <= fc.hi)) >= 0.9
    assert fc.actual["band_coverage"] >= 0.8 and fc.actual["A_inside"], fc.actual
    # d's ceiling (0.79) is passed where the true curve of e passes it
    true_pass = cmid_of(N["e"]) * ((truth_a - r0_of(N["e"])) / (fc.passes.level - r0_of(N["e"])) - 1) ** (-1 / 1.8)
    assert fc.passes.interval[0] <= true_pass <= fc.passes.interval[1], (true_pass, fc.passes.interval)


def test_forms_are_chosen_by_held_out_error_not_by_fit_so_wrong_ones_are_rejected():
    data = as_data(runs())
    fits = [fit_size(k, d) for k, d in data.items() if k != "e"]
    choices = choose_forms(fits, data, r0_known=True)  # the sizes fitted one by one, each its own B
    best_fit = min(choices, key=lambda c: c.fit_rss)
    assert choices[0] is min(choices, key=lambda c: c.loso_rmse)
    # a form that nests another always fits at least as well: choosing by fit takes a B(N) that predicts worse
    assert best_fit.forms["logB"] == "log-linear" and choices[0].forms["logB"] == "constant"
    assert best_fit.loso_rmse > choices[0].loso_rmse
    fc = forecast_size(data, "e")
    by_forms = {tuple(c.forms.values()): c for c in fc.choices}
    assert fc.choice.forms["A"] == "saturating" and fc.choice.forms["logC"] == "log-linear"
    for wrong in (("constant", "log-linear"), ("log-linear", "log-linear"), ("saturating", "constant")):
        assert by_forms[(*wrong, "constant")].loso_rmse > 1.5 * fc.choice.loso_rmse, (wrong, fc.choices)


def test_constant_laws_are_kept_when_nothing_changes_with_size():
    flat = runs(A_of=lambda n: 0.7, cmid_of=lambda n: 4e4, r0_of=lambda n: 0.4)
    fc = forecast_size(as_data(flat), "e")
    assert fc.choice.forms["A"] in ("constant", "log-linear") and abs(fc.A - 0.7) < 0.03
    assert fc.interval("A")[0] <= 0.7 <= fc.interval("A")[1]


def test_a_ceiling_that_stopped_rising_with_size_is_never_extrapolated_as_predictable():
    """results/scale-gpu: mini's A 0.790, medium's 0.777; a law rising from nano forecast large at 0.948
    and large reached 0.695. The verdict names the stall; a ceiling still rising does not trip it."""
    peaked = runs(A_of=lambda n: A_of(min(n, N["c"])) - 0.04 * (n > N["c"]))  # d below c, e lower still
    fc = forecast_size(as_data(peaked), "e")
    assert not fc.verdict.predictable
    reasons = fc.verdict.reasons
    assert any(r.startswith("the ceiling stopped rising with size: d's A") for r in reasons), reasons
    rising = forecast_size(as_data(runs()), "e")
    assert not any("stopped rising" in r for r in rising.verdict.reasons), rising.verdict.reasons
    flat = forecast_size(as_data(runs(A_of=lambda n: 0.7, cmid_of=lambda n: 4e4, r0_of=lambda n: 0.4)), "e")
    # a level ceiling is no stall: what keeps it from predictable is A's interval alone, which carries the
    # laws' prior misfit (laws.MISFIT_PRIOR) as four fitted sizes cannot rule it out
    assert [r.split(" is ")[0] for r in flat.verdict.reasons] == ["A's 90% interval"], flat.verdict


def test_a_size_without_runs_is_forecast_from_its_parameter_count_and_base_model():
    data = as_data(runs(sizes={k: v for k, v in N.items() if k != "e"}))
    fc = forecast_size(data, "e", params=N["e"], r0=r0_of(N["e"]), n_seeds=3)
    assert fc.actual is None and fc.interval("A")[0] <= A_of(N["e"]) <= fc.interval("A")[1]
    assert fc.curve[0] == pytest.approx(r0_of(N["e"]))
    before = as_data(runs().query("size != 'e' or compute == 0"))  # e's base model evaluated, no RL yet
    fc = forecast_size(before, "e")
    assert fc.actual is None and fc.curve[0] == pytest.approx(before["e"].r0())


def test_a_size_whose_runs_have_not_ended_is_compared_so_far_and_its_a_is_not_claimed(tmp_path, capsys):
    """results/scale-gpu3: large's runs stopped at 37% of the budget with the window; the comparison fitted
    them anyway and printed "its own A 0.706 (inside the interval)" and a medium → large step from it. Runs
    that have not ended are compared as far as they go: the band's coverage of their evaluations, no A."""
    df = runs()
    early = df.query("size != 'e' or compute <= 0.4 * 153_600")
    fc = forecast_size(as_data(early), "e")
    a = fc.actual
    assert a["finished"] is False and a["compute_reached"] == pytest.approx(0.4, abs=0.02), a
    assert a["A"] is None and a["A_inside"] is None and a["points"] == 12 and a["band_coverage"] >= 0.8, a
    assert [p["sizes"] for p in fc.trend["pairs"]][-1] == ["c", "d"]  # no step to e from a part of its curve
    assert any(line.startswith("  actual so far: its runs reach 40% of the other sizes' compute") for line in
               forecast_lines(fc)), forecast_lines(fc)  # fmt: skip
    done = forecast_size(as_data(df), "e").actual
    assert done["finished"] is True and done["A_inside"] and done["compute_reached"] == 1.0
    one_short = df.query("size != 'e' or seed != seed.max() or compute <= 0.5 * 153_600")  # its other runs ended
    assert forecast_size(as_data(one_short), "e").actual["compute_reached"] == pytest.approx(0.5, abs=0.02)
    # a fitted size whose runs have not ended is named before its extrapolated A enters the laws
    cut = df.query("size != 'd' or compute <= 0.5 * 153_600")
    cut = cut.rename(columns={"compute": "compute/samples", "value": "val/mean_at_16"})
    cut.to_csv(tmp_path / "c.csv", index=False)
    assert main(["sizes", str(tmp_path / "c.csv")]) == 0
    assert "warning: size 'd''s runs reach 50% of the other sizes' compute" in capsys.readouterr().out


def test_the_leave_one_size_out_backtest_states_its_coverage():
    six = {**N, "f": 60e6}
    bt = backtest_sizes(as_data(runs(sizes=six)))
    assert list(bt.rows["size"]) == list(six) and (bt.rows["points"] == 30).all()
    within = (bt.rows["band_coverage"] * bt.rows["points"]).sum() / bt.rows["points"].sum()
    assert bt.coverage == pytest.approx(within)  # the share of every size's evaluations its band holds
    assert bt.level <= bt.coverage < 1, bt.rows  # the truth follows the laws: the 90% band holds 90% or more
    interior = bt.rows[bt.rows["size"].isin(["c", "d", "e"])]
    assert (interior["band_coverage"] >= 0.8).all(), interior
    assert bt.lines()[0].startswith("leave-one-size-out backtest: 6 size(s) forecast from the others; 90% band holds")
    laws, plain = bt.a_rmse()  # the truth follows the laws: they beat taking the nearest size's A for one's own
    assert laws < plain and bt.lines()[1] == f"  A's RMS error: the laws {laws:.3f}; the nearest size's A taken " \
        f"for its own {plain:.3f}", bt.lines()  # fmt: skip


def test_the_command_forecasts_the_largest_backtests_and_plots(tmp_path, capsys):
    df = runs().rename(columns={"compute": "compute/samples", "value": "val/mean_at_16"})
    df.to_csv(tmp_path / "curves.csv", index=False)
    assert main(["sizes", str(tmp_path / "curves.csv"), "--plot", str(tmp_path / "sizes.png")]) == 0
    out = capsys.readouterr().out
    assert "forecast of e (N 25.800M): A 0.8" in out and "passes 0.7" in out
    assert "leave-one-size-out backtest: 4 size(s)" in out and (tmp_path / "sizes.png").stat().st_size > 10_000
    assert "* held-out RMSE" in out and "fit RSS" in out


def test_once_the_held_out_size_has_run_the_backtest_can_hold_it_out_too(tmp_path, capsys):
    """results/scale-gpu3: after large ran, the study's backtest over all five sizes (each from the other four)
    had to be computed in Python. ``--backtest-all`` folds the held-out size in, once its runs have ended."""
    df = runs().rename(columns={"compute": "compute/samples", "value": "val/mean_at_16"})
    df.to_csv(tmp_path / "c.csv", index=False)
    assert main(["sizes", str(tmp_path / "c.csv"), "--backtest-all"]) == 0
    out = capsys.readouterr().out
    assert "leave-one-size-out backtest: 5 size(s) forecast from the others" in out
    assert re.search(r"^  e +band \d+% of 30, A 0\.\d+ vs", out, re.M), out  # the held-out size is a fold
    df[(df["size"] != "e") | (df["compute/samples"] <= 0.4 * 153_600)].to_csv(tmp_path / "early.csv", index=False)
    assert main(["sizes", str(tmp_path / "early.csv"), "--backtest-all"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: --backtest-all: the held-out size 'e': its runs reach 40%"), err
    df[df["size"] != "e"].to_csv(tmp_path / "before.csv", index=False)
    assert main(["sizes", str(tmp_path / "before.csv"), "--holdout", "e", "--params", "25.8e6", "--backtest-all"]) == 2
    assert capsys.readouterr().err.startswith("error: --backtest-all: the held-out size 'e' has no runs;")
    assert reach_text(0.946) == "94%" and reach_text(0.4) == "40%"  # short of FINISHED_AT (95%) never reads 95%


def test_the_forecast_is_written_as_data_to_commit_before_the_size_runs(tmp_path, capsys):
    """results/scale-gpu committed large's forecast as printed text and a plot: its curve and band had no
    numbers. ``--json`` writes them, A with its interval, where it passes, the verdict, as strict JSON."""
    df = runs().query("size != 'e' or compute == 0")  # e's base model evaluated, no RL yet
    df.rename(columns={"compute": "compute/samples", "value": "val/mean_at_16"}).to_csv(tmp_path / "c.csv", index=False)
    assert main(["sizes", str(tmp_path / "c.csv"), "--holdout", "e", "--json", "-"]) == 0
    out, err = capsys.readouterr()
    record = json.loads(out, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert "forecast of e" in err  # the summary goes to stderr when the JSON takes stdout
    assert record["size"] == "e" and record["A_interval"][0] <= record["A"] <= record["A_interval"][1]
    curve = record["curve"]
    assert len(curve["compute"]) == len(curve["median"]) > 10
    assert all(lo <= m <= hi for lo, m, hi in zip(curve["lo"], curve["median"], curve["hi"], strict=True))
    assert set(record["passes"]) == {"A", "compute", "interval", "share_of_draws"} and record["actual"] is None
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["sizes", str(tmp_path / "c.csv"), "--plot", str(blocked / "sizes.png")]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: --plot ") and out == ""  # refused before any fit printed a line


@pytest.mark.parametrize(
    ("edit", "args", "message"),
    [
        (lambda df: df[df["size"].isin(["a", "b", "e"])], [], r"2 size\(s\) besides 'e': forecasting one size needs"),
        (lambda df: df.drop(columns="parameters"), [], "no column 'parameters': each row needs its size's parameter"),
        (
            lambda df: df.assign(parameters=df["parameters"].where(df["size"] != "b", 0.46e6)),
            [],
            "sizes 'a' and 'b' have the same parameter count",
        ),
        (
            lambda df: df.assign(parameters=df["parameters"].where(df.index != 0, 1.0)),
            [],
            "size 'a' has more than one parameter count",
        ),
        (lambda df: df, ["--holdout", "huge"], "--holdout 'huge' is not a size of"),
        (
            lambda df: df.assign(**{"val/mean_at_16": df["val/mean_at_16"].where(df["size"] != "b", 0.5)}),
            [],
            "size 'b': no sigmoid gain is identifiable",
        ),
        (
            lambda df: df.assign(**{"val/mean_at_16": df["val/mean_at_16"].where(df.index != 3, 1.5)}),
            [],
            "line 5: column 'val/mean_at_16' \\(1.5\\) lies outside \\[0, 1\\]",
        ),
        (  # builds whose seeds are numbered alike: one seed's rows under two builds, two runs taken for one
            lambda df: df.assign(build=["b0", "b1"] * (len(df) // 2) + ["b0"] * (len(df) % 2)),
            [],
            r"size 'a': seed \S+ appears under 2 builds; a run is one seed of one build",
        ),
    ],
)
def test_bad_input_is_one_error_line_naming_the_fix(tmp_path, capsys, edit, args, message):
    df = edit(runs().rename(columns={"compute": "compute/samples", "value": "val/mean_at_16"}))
    df.to_csv(tmp_path / "curves.csv", index=False)
    assert main(["sizes", str(tmp_path / "curves.csv"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert re.search(message, err), err


def test_two_sizes_with_no_parameter_count_are_refused():
    with pytest.raises(FitError, match="parameters = 0"):
        size_data({"a": (0, [0, 1], [0.1, 0.2], None)})


def test_a_size_forecast_is_read_as_any_forecast_is_and_is_complete_when_built():
    """Issue 61: ``SizeForecast`` had its own ``predictable``/``reasons``, ``band_at`` and ``A_interval`` beside the
    ``Forecast`` interface. Now a caller holding a forecast fitted over compute or one across sizes reads both the
    same way: the verdict a ``Verdict``, the band, the draws, A's interval and the record; nothing is filled in
    after it is built."""
    from scalefit import fit_and_forecast
    from scalefit.forecasts.interface import CurveForecast, Verdict

    data = as_data(runs())
    own = data["e"]
    c, v, k = own.mean_curve()
    size = forecast_size(data, "e")
    _, single = fit_and_forecast(own.compute, own.value, runs=own.seed)
    for fc in (single, size):
        assert isinstance(fc, CurveForecast) and isinstance(fc.verdict, Verdict), type(fc)
        lo, hi = fc.prediction_band(c[1:], 3)
        assert lo.shape == hi.shape == (len(c) - 1,) and (lo <= hi).all()
        assert fc.prediction_draws(c[1:], 3).shape[1] == len(c) - 1 and fc.mean_draws(c[1:]).shape[1] == len(c) - 1
        a_lo, a_hi = fc.interval("A")
        assert a_lo <= float(np.median(fc.mean_draws([1e12])[:, 0])) <= a_hi + 1e-9  # far out, the curve is at A
        assert json.loads(json.dumps(fc.to_dict(), default=str))
    assert (
        size.verdict.predictable == size.to_dict()["predictable"] and size.verdict.reasons == size.to_dict()["reasons"]
    )
    assert size.interval("A") == tuple(size.to_dict()["A_interval"])
    lo, hi = size.prediction_band(c, k)  # the band the actual is scored against: of its own seeds at each compute
    inside = ((v >= lo) & (v <= hi))[c > 0].mean()
    assert size.actual["band_coverage"] == pytest.approx(inside)
    np.testing.assert_allclose(size.point(size.compute), size.curve)
    with pytest.raises(AttributeError):
        size.verdict = Verdict(True, [])  # built whole, never amended


def test_the_sizes_room_reads_its_csv_without_the_command_line(tmp_path):
    """Issue 61: ``scalefit/sizes.py`` imported ``read_curves`` from ``scalefit.cli``, which imported it back for
    its ``sizes`` subcommand: a circle. The room reads a curves CSV, fits and forecasts with the command line
    never imported; the command line imports the room."""
    import subprocess
    import sys

    df = runs().rename(columns={"compute": "compute/samples", "value": "val/mean_at_16"})
    df.to_csv(tmp_path / "c.csv", index=False)
    code = (
        "import sys; from scalefit.sizes import read_sizes, forecast_size; "
        f"d = read_sizes({str(tmp_path / 'c.csv')!r}, 'compute/samples', 'val/mean_at_16'); "
        "assert forecast_size(d, 'e', n_draws=50).A > 0; "
        "assert 'scalefit.cli' not in sys.modules, 'the sizes room imported the command line'; "
        "import scalefit.cli; assert 'scalefit.sizes.command' in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_a_law_that_predicted_its_few_held_out_sizes_still_carries_a_misfit_that_fades_with_more():
    """Issue 62: a misfit measured on three or four held-out sizes is shrunk towards the prior, not taken
    as 0 where those few happened to land close, and it fades as held-out sizes accumulate."""
    from scalefit.sizes.laws import MISFIT_PRIOR, MISFIT_PRIOR_FOLDS

    flat = {"A_of": lambda n: 0.7, "cmid_of": lambda n: 4e4, "r0_of": lambda n: 0.4}
    few = forecast_size(as_data(runs(**flat)), "e")
    ten = {f"s{i}": n for i, n in enumerate(np.geomspace(3e5, 4e7, 10))}
    many = forecast_size(as_data(runs(sizes=ten, **flat)), "s9")
    assert few.choice.forms["A"] == many.choice.forms["A"] == "constant"
    for fc, folds in ((few, 4), (many, 9)):
        floor = MISFIT_PRIOR["A"] * np.sqrt(MISFIT_PRIOR_FOLDS / (MISFIT_PRIOR_FOLDS + folds))
        assert fc.misfit["A"].sd >= 0.99 * floor and fc.misfit["A"].dof == folds + MISFIT_PRIOR_FOLDS
    assert many.misfit["A"].sd < few.misfit["A"].sd
    assert np.diff(many.interval("A"))[0] < np.diff(few.interval("A"))[0]


def test_the_backtest_says_where_the_laws_do_not_beat_the_nearest_sizes_a():
    """results/scale-gpu3 over its five sizes: the laws' A erred by 0.107 RMS, taking the nearest size's A for
    one's own by 0.079. Laws that do not generalise past a plain rule are said to, beside the coverage."""
    from scalefit.sizes.data import read_sizes

    bt = backtest_sizes(read_sizes(str(ROOT / "results" / "scale-gpu3" / "sizes.csv"), "compute/samples",
                                   "val/mean_at_16"))  # fmt: skip
    laws, plain = bt.a_rmse()
    assert laws == pytest.approx(0.107, abs=0.005) and plain == pytest.approx(0.079, abs=0.005), bt.lines()
    assert bt.lines()[1].endswith("(the laws do not beat that plain rule)"), bt.lines()
    nearest = bt.rows.set_index("size")["A_nearest"]  # nearest in log N: micro's is mini (0.803), not nano (0.594)
    assert nearest["large"] == pytest.approx(0.762, abs=0.005) and nearest["micro"] == pytest.approx(0.803, abs=0.005)


@pytest.mark.parametrize(
    "study", ["scale-gpu3/sizes-smaller.csv", "scale-gpu3/sizes.csv", "scale-gpu2/sizes.csv", "scale-gpu/sizes.csv"]
)
def test_the_backtest_bands_of_the_recorded_studies_hold_near_their_level(study):
    """Each size of the recorded across-size studies forecast from the others: the 90% band holds at least
    80% of their evaluations (before issue 62's misfit prior and Student's t: 52%, 81%, 75%). scale-gpu3
    was held out when the prior was set, on the other two; its large ran after (98% with it, 5 folds)."""
    from scalefit.sizes.data import read_sizes

    bt = backtest_sizes(read_sizes(str(ROOT / "results" / study), "compute/samples", "val/mean_at_16"))
    assert bt.coverage >= 0.8, bt.lines()

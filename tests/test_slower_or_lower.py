"""Slower or lower (scalefit.forecasts.slower_or_lower): the knee read from the data, and a variant's
difference split into its ceiling and its efficiency, on synthetic campaigns whose truth is known."""

from __future__ import annotations

import numpy as np
import pytest

from scalefit.data.synthetic import campaign_runs
from scalefit.forecasts.pooled import fit_and_forecast_campaign
from scalefit.forecasts.slower_or_lower import knee_from_data, separate, separating_compute
from scalefit.models.curve import sigmoid
from scalefit.models.sigmoid import fit_sigmoid

CM = 3000.0


def _curve(c_max: float, cm: float = CM, b: float = 1.8, seeds: int = 4, sd: float = 0.004):
    rng = np.random.default_rng(0)
    c = np.tile(np.geomspace(c_max / 30, c_max, 20), seeds)
    runs = np.repeat(np.arange(seeds), 20)
    y = sigmoid(c, 0.8, b, cm, 0.3) + rng.normal(0, sd, len(c))
    return c, y, runs


def test_the_knee_is_read_from_the_data_not_from_a_fit():
    before = knee_from_data(*_curve(c_max=0.8 * CM))  # the data end before C_mid: still steepening
    after = knee_from_data(*_curve(c_max=20 * CM))  # well past it: flattening
    assert before is not None and not before.passed and before.slope_last > before.slope_middle
    assert after is not None and after.passed and after.slope_last < after.slope_middle
    assert before.text().startswith("not past its knee (still rising as fast or faster) by the data: slope ")
    assert after.text().startswith("past its knee (flat) by the data: slope "), after.text()  # not "not past"


def test_a_plateau_is_past_its_knee():
    """Far past C_mid both windows are flat: no deceleration between them, yet the curve has shown
    its ceiling. Read as still steepening, its ceiling would be opened to the grid's top. A curve
    that has not yet risen is not a plateau."""
    k = knee_from_data(*_curve(c_max=40 * CM))
    assert k is not None and k.flat and k.passed, k
    assert "past its knee (flat)" in k.text()
    c, y, runs = _curve(c_max=100 * CM)  # every point on the plateau: the gain counts from zero compute
    k = knee_from_data(np.r_[np.zeros(4), c], np.r_[np.full(4, 0.3), y], np.r_[np.arange(4), runs])
    assert k is not None and k.flat and k.passed, k
    rising = knee_from_data(*_curve(c_max=0.8 * CM))
    assert not rising.flat and not rising.passed
    before = knee_from_data(*_curve(c_max=0.1 * CM))  # barely risen: flat, but no plateau
    assert not before.flat and not before.passed, before


def test_one_run_gets_a_knee_test_with_its_own_scatter():
    c, y, _ = _curve(c_max=20 * CM, seeds=1)
    k = knee_from_data(c, y)
    assert k is not None and k.runs == 1 and np.isfinite(k.se) and k.passed


def test_two_runs_that_agree_by_chance_do_not_make_noise_a_knee():
    """Two runs' spread of slopes has one degree of freedom: where their noise happens to agree, it
    reads near zero, and any wiggle between the windows is "beyond noise". Here two runs rise at one
    rate per e-fold of compute to the end (no knee), with the same noise; each run's own scatter about
    its windows' lines floors the standard error, so the wiggle stays noise."""
    c = np.geomspace(1000, 64000, 25)
    y = 0.3 + 0.08 * np.log(c / 1000) + np.random.default_rng(3).normal(0, 0.02, len(c))
    k = knee_from_data(np.r_[c, c], np.r_[y, y + 0.01], np.repeat([0, 1], len(c)), start=0.3)
    alone = knee_from_data(c, y, start=0.3)
    assert k is not None and alone is not None and k.slope_last < k.slope_middle, k  # a wiggle down
    assert k.se > 0 and k.se == pytest.approx(alone.se / np.sqrt(2)), (k, alone)  # two runs' own scatter
    assert not k.passed and "not past its knee (slowing, within noise)" in k.text(), k


def test_two_runs_with_no_knee_read_one_about_as_often_as_one_standard_error_allows():
    """The false-knee rate on two runs rising at one rate, with the default CPU campaign's noise (0.02
    an evaluation): deceleration by one standard error, one-sided, is 16% by chance. With two runs'
    spread alone the rate was 26% of these 1,000 draws; floored by their own scatter it is 18%."""
    c = np.geomspace(1000, 64000, 25)
    rng = np.random.default_rng(0)
    knees = 0
    for _ in range(1000):
        y = [0.3 + 0.08 * np.log(c / 1000) + rng.normal(0, 0.02, len(c)) for _ in range(2)]
        k = knee_from_data(np.r_[c, c], np.r_[y[0], y[1]], np.repeat([0, 1], len(c)), start=0.3)
        knees += k.passed
    assert knees / 1000 <= 0.2, knees


def test_too_few_points_give_no_knee_test():
    assert knee_from_data([0, 10, 20], [0.1, 0.2, 0.3]) is None


@pytest.fixture(scope="module")
def campaign():
    """baseline; slower (same A, C_mid 3x); lower (A - 0.08, same C_mid): run far past every knee."""
    truth = {"baseline": (CM, 1.8, 0.75), "slower": (3 * CM, 1.8, 0.75), "lower": (CM, 1.8, 0.67)}
    df = campaign_runs(truth, seeds=4, seed=3, c_max=15 * CM, n_points=41, n_prompts=1000)
    data = {v: (g["compute"].to_numpy(), g["value"].to_numpy(), g["seed"].to_numpy()) for v, g in df.groupby("variant")}
    _, fcs = fit_and_forecast_campaign(data, n_resamples=300, backtest=False)
    return fcs, float(df["compute"].max())


def test_a_slower_variant_is_read_as_slower_not_lower(campaign):
    fcs, budget = campaign
    s = separate(fcs["slower"], fcs["baseline"], budget, margin=0.02)
    assert s.ceiling == "same", s.text()
    assert s.efficiency == "slower", s.text()
    assert 2.5 < s.later < 3.6, s.text()  # the truth: C_mid 3x, B the same
    assert s.label == "slower"
    assert "the baseline's compute" in s.efficiency_text()


def test_a_lower_variant_is_read_as_lower_not_slower(campaign):
    fcs, budget = campaign
    s = separate(fcs["lower"], fcs["baseline"], budget, margin=0.02)
    assert s.ceiling == "lower", s.text()
    assert s.efficiency == "same", s.text()
    assert s.delta_a_interval[1] < -0.02 and s.label == "lower"


def test_the_separating_compute_is_where_a_slower_reading_would_have_caught_up():
    """A variant fitted lower and slower, read at a budget before it caught up: if it were only
    slower (the baseline's ceiling, its own C_mid and B), it would come within half the margin of
    the baseline at the compute given, and not before."""
    base = np.array([[0.75, 1.8, CM, 0.3]])
    variant = np.array([[0.67, 1.8, 3 * CM, 0.3]])
    fit = fit_sigmoid(*_curve(c_max=20 * CM)[:2])  # whose curve and declared ceiling the rows are read by
    c = separating_compute(variant, base, CM, 0.02, (fit, fit))
    assert c is not None and c > CM

    def gap(at: float) -> float:
        return abs(sigmoid(at, 0.75, 1.8, 3 * CM, 0.3) - sigmoid(at, 0.75, 1.8, CM, 0.3))

    assert gap(c) <= 0.01 < gap(c / 1.05)
    assert separating_compute(np.array([[0.74, 1.8, 3 * CM, 0.3]]), base, CM, 0.02, (fit, fit)) is None  # within margin


def test_a_half_budget_call_on_a_slower_variant_says_slower_or_lower_and_what_compute_tells():
    """Issue 40 item 1: the same ceiling as the baseline, C_mid 3x (a learning rate cut), read from
    half of a budget of 6x the baseline's C_mid. Its difference at the budget could come from a
    lower ceiling or a later knee: the call is "slower or lower: cannot tell yet", with the reading
    (slower, ceiling not yet told) and the compute at which the two part. A variant whose ceiling
    is lower is still called worse, read as lower."""
    from scalefit.forecasts.interface import call_difference
    from scalefit.forecasts.pooled import forecast_campaign
    from scalefit.forecasts.pooled_fit import fit_campaign

    truth = {
        "baseline": (CM, 1.8, 0.75),
        "slower": (3 * CM, 1.8, 0.75),
        "lower": (CM, 1.8, 0.69),
        "v3": (1.2 * CM, 1.9, 0.74),
        "v4": (0.9 * CM, 1.7, 0.76),
    }
    budget = 6 * CM
    df = campaign_runs(truth, seeds=4, seed=2, c_max=budget, n_points=41, n_prompts=300, drift_sd=0.006, seed_sd=0.005)
    data = {v: (g["compute"].to_numpy(), g["value"].to_numpy(), g["seed"].to_numpy()) for v, g in df.groupby("variant")}
    cfit = fit_campaign(data, fit_upto=dict.fromkeys(truth, budget / 2), a_grid=np.arange(0.05, 1.0, 0.005))
    fcs = forecast_campaign(cfit, target=dict.fromkeys(truth, budget), n_resamples=300)

    slower = call_difference(fcs["slower"], fcs["baseline"], budget)
    assert slower.label == "cannot tell yet" and slower.reading.label == "slower, ceiling not yet told", slower
    text = slower.text(0.02)
    assert text.startswith("slower or lower: cannot tell yet (") and "× the baseline's compute" in text, text
    assert slower.reading.separating_compute > budget and "would separate slower from lower" in text, text
    lower = call_difference(fcs["lower"], fcs["baseline"], budget)
    assert lower.label == "worse" and lower.reading.label == "lower", lower


def test_a_forecast_still_steepening_is_not_predictable_and_backs_no_call():
    """Recorded loo-gpu6, from half the budget: fp32=off's runs still steepen in log C over their
    last doubling (the knee from the data). Its joint forecast said *predictable* and "no difference"
    (Δ -0.003 [-0.017, +0.013]) before the knee test was read by the verdict; its ceiling is open
    above, so it is not predictable now, saying why, and the call is not made. At the budget the
    measured difference is +0.002 [-0.021, +0.026], not resolved at ±0.02. length=penalty (+0.16 at
    the budget, past its knee by half of it) is still called better."""
    from pathlib import Path

    import pandas as pd

    from analysis.loo import campaign_model
    from runners.campaign.load import load_campaign
    from scalefit.forecasts.interface import call_difference, past_knee

    root = Path(__file__).resolve().parents[1]
    settings = load_campaign(root / "experiments" / "campaigns" / "loo-gpu6.yaml").fit
    half = campaign_model(pd.read_csv(root / "results" / "loo-gpu6" / "curves.csv"), settings, 300, fraction=0.5)
    base, fp32 = half.forecasts["baseline"], half.forecasts["fp32=off"]
    budget = 2 * float(base.fit.compute.max())
    assert not past_knee(fp32) and not fp32.verdict.predictable
    assert any(r.startswith("its data do not show its knee") for r in fp32.verdict.reasons), fp32.verdict.reasons
    call = call_difference(fp32, base, budget, margin=settings.margin)
    assert call.label == "cannot tell yet", call
    gain = call_difference(half.forecasts["length=penalty"], base, budget, margin=settings.margin)
    assert gain.label == "better" and past_knee(half.forecasts["length=penalty"]), gain


@pytest.fixture(scope="module")
def efficiency_table():
    """A synthetic efficiency campaign through the LOO table: the baseline, a learning rate halved
    (C_mid 2x, same A) and a lower control (A - 0.08), 4 seeds, run to 6x the baseline's C_mid."""
    from analysis.table import fit_table
    from runners.campaign.spec import fit_settings
    from tests.bench_predict import as_loo_curves

    truth = {"baseline": (CM, 1.8, 0.75), "lr_half": (2 * CM, 1.8, 0.75), "control=lower": (CM, 1.8, 0.67)}
    df = campaign_runs(truth, seeds=4, seed=5, c_max=8 * CM, n_points=41, n_prompts=300, drift_sd=0.005, seed_sd=0.005)
    df = as_loo_curves(df)
    settings = fit_settings({"a_grid": "0.05:1.0:0.005"})
    table, extra = fit_table(df, settings, n_boot=200)
    return df, table.set_index("variant", drop=False), extra, settings


def test_the_loo_table_and_its_plot_say_slower_or_lower(efficiency_table, tmp_path, monkeypatch):
    """Issue 40 item 1: the table says, per variant, whether it differs in its ceiling or its
    efficiency (``reading``, at the budget and at half of it), and the plot's legend says it too."""
    from matplotlib.figure import Figure

    from analysis.render import plot_campaign, to_markdown

    df, table, extra, settings = efficiency_table
    assert table.at["lr_half", "reading"].startswith("slower"), table.at["lr_half", "reading_text"]
    assert "× the baseline's compute" in table.at["lr_half", "reading_text"]
    assert table.at["control=lower", "reading"] == "lower", table.at["control=lower", "reading_text"]
    assert table.at["control=lower", "half_reading"] == "lower"
    assert "reading at the budget: slower" in to_markdown(table.reset_index(drop=True))
    saved, save = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), save(fig, *a, **k))[1])
    plot_campaign(df, extra, tmp_path / "loo_curves.png", settings)
    labels = [t.get_text() for t in saved[0].axes[0].get_legend().get_texts()]
    assert any(t.startswith("lr_half") and "— slower" in t for t in labels), labels
    assert any(t.startswith("control=lower") and t.endswith("— lower") for t in labels), labels


def test_each_variant_s_runs_carry_its_reading_in_mlflow(efficiency_table, tmp_path):
    """A real SQLite store: every run of a variant gets ``prl.reading``; a refit with no reading for
    it removes the tag."""
    from mlflow.tracking import MlflowClient

    from analysis.loo import tag_readings
    from runners.tracking import store

    df, table, _, _ = efficiency_table
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("c")
    ids = {run: client.create_run(exp, run_name=run).info.run_id for run in df["run"].unique()}
    df = df.assign(run_id=df["run"].map(ids))
    tag_readings(df, table.reset_index(drop=True), client)
    tags = {run: client.get_run(i).data.tags.get(store.READING, "") for run, i in ids.items()}
    assert all(tags[f"lr_half/seed{s}"].startswith("slower") for s in range(4)), tags
    assert tags["control=lower/seed0"].startswith("lower: lower ceiling")
    assert not any(tags[f"baseline/seed{s}"] for s in range(4))
    tag_readings(df, table.reset_index(drop=True).drop(columns=["reading", "reading_text"]), client)
    assert store.READING not in client.get_run(ids["lr_half/seed0"]).data.tags


def test_a_variant_behind_is_never_framed_faster_or_higher():
    """loo-gpu's off_policy=ppo at half the budget: Δ -0.116, its ceiling far lower (ΔA -0.42) but
    open at the grid's edge, its fitted knee earlier (efficiency "faster"). Behind at the budget, it
    is not "faster or higher"; a slower variant behind is "slower or lower"."""
    from scalefit.forecasts import interface as prediction
    from scalefit.forecasts.interface import Call
    from scalefit.forecasts.slower_or_lower import Separation

    def reading(later: float) -> Separation:
        span = (later / 2, later * 2)
        return Separation(-0.42, (-0.47, -0.32), True, 0.36, later, span, 0.0, (-0.01, 0.01), None, 0.02, 1e4)

    behind = Call("cannot tell yet", -0.116, -0.153, -0.009, "", reading(0.04))
    assert prediction.withhold(behind, "straddles").reason == "straddles"
    slower = Call("cannot tell yet", -0.116, -0.153, -0.009, "", reading(3.0))
    assert prediction.withhold(slower, "straddles").text(0.02).startswith("slower or lower: cannot tell yet")


def test_draws_that_all_failed_give_no_reading_not_a_crash(campaign):
    """A forecast whose every resample failed (NaN draws) has no reading; the table goes on."""
    import copy

    fcs, budget = campaign
    broken = copy.copy(fcs["slower"])
    broken.samples = np.full_like(fcs["slower"].samples, np.nan)
    assert separate(broken, fcs["baseline"], budget, margin=0.02) is None


@pytest.fixture(scope="module")
def loo_gpu7_half():
    """Recorded loo-gpu7 (one H200, micro, 4 seeds an arm, 400 steps) fitted on half of each arm's compute."""
    from pathlib import Path

    import pandas as pd

    from analysis.loo import campaign_model
    from runners.campaign.load import load_campaign

    root = Path(__file__).resolve().parents[1]
    settings = load_campaign(root / "experiments" / "campaigns" / "loo-gpu7.yaml").fit
    curves = pd.read_csv(root / "results" / "loo-gpu7" / "curves.csv")
    return campaign_model(curves, settings, 300, fraction=0.5), settings


def test_a_rate_cut_read_before_its_knee_is_not_read_as_a_lower_ceiling(loo_gpu7_half):
    """Recorded loo-gpu7, from half the budget: lr_quarter (the learning rate a quarter) still
    steepens over its last doubling of compute. Its fit, alone or joint, bends it at 0.63 and read
    "lower ceiling (ΔA -0.158 [-0.180, -0.122])"; at the budget it had reached 0.68 and was still
    rising faster, its full fit's A 0.92. Its ceiling is not told; the call may stand only over the
    whole range its open ceiling allows (up to 0.679 at the budget with A = 1), and its interval
    holds that range. length=penalty, past its knee, is still called better."""
    from scalefit.forecasts.interface import call_difference, past_knee

    half, settings = loo_gpu7_half
    base, quarter = half.forecasts["baseline"], half.forecasts["control=lr_quarter"]
    budget = half.budgets["baseline"]
    assert not past_knee(quarter)
    call = call_difference(quarter, base, budget, margin=settings.margin)
    assert call.reading is not None and call.reading.ceiling == "cannot tell", call.reading.text()
    top = float(quarter.open_ceiling.top(budget)[0])
    assert call.hi >= top - float(base.point([budget])[0]) - 1e-9, (call, top)
    assert call.label in ("worse", "cannot tell yet")
    gain = call_difference(half.forecasts["length=penalty"], base, budget, margin=settings.margin)
    assert gain.label == "better" and gain.reading.ceiling == "higher", gain


def test_a_ceiling_the_data_have_not_bent_towards_decides_no_asymptote_verdict():
    """The paper's rule compares asymptotes; one fitted to a curve still steepening over its last
    doubling is the sigmoid's guess, and the verdict says it cannot decide, naming the knee test."""
    from scalefit.decide.compare import compare_fits
    from scalefit.forecasts.single import forecast
    from scalefit.models.sigmoid import fit_sigmoid

    truth = {"baseline": (CM, 1.8, 0.75), "steepening": (8 * CM, 1.8, 0.75)}
    df = campaign_runs(truth, seeds=4, seed=4, c_max=6 * CM, n_points=31, n_prompts=1000)
    fcs = {
        v: forecast(
            fit_sigmoid(g["compute"], g["value"], runs=g["seed"], a_grid=np.arange(0.05, 1.0, 0.005)), n_resamples=200
        )
        for v, g in df.groupby("variant")
    }
    c = compare_fits(
        fcs["baseline"].fit,
        fcs["steepening"].fit,
        forecasts=(fcs["baseline"], fcs["steepening"]),
        names=("baseline", "steepening"),
    )
    assert c.rule == "undecided" and "steepening's ceiling is not told by its data" in c.verdict, c.verdict
    assert "baseline's ceiling" not in c.verdict, c.verdict


def test_a_forecast_counts_its_plateau_s_gain_from_r0_not_from_its_first_evaluation():
    """A forecast's fitted points hold no zero compute, so the knee test read through a forecast
    counted the gain from its first evaluation: a curve that had risen before it (the default CPU
    campaign's, 0.69 -> 0.83 in its first 30 of 200 steps) then crept on had a small "gain" and never
    read as a plateau, and its asymptote verdict said it could not decide. The gain counts from R0."""
    from scalefit.forecasts.interface import knee, past_knee
    from scalefit.forecasts.single import forecast
    from scalefit.models.sigmoid import fit_sigmoid

    c, y, runs = _curve(c_max=100 * CM)  # every fitted point on the plateau, R0 0.3 measured at zero compute
    c, y, runs = np.r_[np.zeros(4), c], np.r_[np.full(4, 0.3), y], np.r_[np.arange(4), runs]
    fc = forecast(fit_sigmoid(c, y, runs=runs, a_grid=np.arange(0.05, 1.0, 0.005)), n_resamples=100)
    k = knee(fc)
    assert fc.fit.compute.min() > 0 and abs(fc.fit.R0 - 0.3) < 1e-9
    assert k is not None and abs(k.gain - (y[c > 0][-20:].mean() - 0.3)) < 0.01, k
    assert k.flat and past_knee(fc), k


def test_a_second_rise_after_an_early_jump_is_not_a_plateau():
    """Counted from R0, a jump made before the first evaluation (0.30 -> 0.65) dwarfs what follows, so
    a second rise still steepening at the end of the data (slope 0.023 then 0.056 per e-fold) rose
    under a tenth of that gain over its last doubling; read flat, its ceiling would have been closed
    (found by review of 81b4f8a). Steepening beyond noise is no plateau."""

    def truth(c):
        with np.errstate(divide="ignore"):
            return sigmoid(c, 0.65, 3.0, 100.0, 0.30) + sigmoid(c, 0.20, 1.5, 30000.0, 0.0) * (c > 0)

    rng = np.random.default_rng(0)
    cgrid = np.geomspace(1000, 16000, 16)
    c, runs = np.tile(cgrid, 2), np.repeat(np.arange(2), len(cgrid))
    y = truth(c) + rng.normal(0, 0.006, len(c))
    k = knee_from_data(c, y, runs, start=0.30)
    assert k is not None and k.slope_last > k.slope_middle + k.se, k  # steepening beyond noise
    assert k.slope_last * np.log(2) < 0.1 * k.gain, k  # yet under a tenth of the gain since R0
    assert not k.flat and not k.passed and "not past its knee" in k.text(), k


@pytest.mark.parametrize("cpu", ["epyc", "xeon"])
def test_the_recorded_default_campaign_calls_its_axis_alike_on_both_cpus(tmp_path, cpu):
    """The default `make ablation`'s recorded runs (results/loo-cpu/seeds-0-1-2: baseline and
    zero_variance=off on seeds 0, 1 and 2, evaluated every 20 steps; a fresh clone on a 2-core AMD
    EPYC, and the same runs on an Intel Xeon, xeon/: runs evaluated every 10 steps, thinned, which is
    what a run evaluated every 20 computes) fitted with today's campaign file as `analysis fit
    --curves` fits them: on both CPUs the baseline is identified off its grid's edges and the axis is
    called the same way, "no difference" within ±0.05. A regression test of these recorded runs; how
    often other seed groups call it is in results/loo-cpu/seed-groups.md (three seeds: 8 of 9)."""
    from pathlib import Path

    import pandas as pd

    from tests.conftest import run_in_process

    root = Path(__file__).resolve().parents[1] / "results" / "loo-cpu" / "seeds-0-1-2"
    curves = root / {"epyc": "curves.csv", "xeon": "xeon/curves.csv"}[cpu]
    res = run_in_process("analysis", "fit", "loo-cpu", "--curves", str(curves), "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    t = pd.read_csv(tmp_path / "loo_table.csv").set_index("variant")
    assert t.loc["baseline", "seeds"] == t.loc["zero_variance=off", "seeds"] == 3
    zv = t.loc["zero_variance=off"]
    assert zv["call"] == "no difference", zv["call_text"]
    assert -0.05 < zv["call_lo"] < zv["call_hi"] < 0.05, zv[["call_lo", "call_hi"]]
    assert not t.loc["baseline", "a_at_edge"] and t.loc["baseline", "A_hi"] < 1.0 - 1e-9, t.loc["baseline"]
    assert "no difference" in res.stdout and "its interval is inside ±0.05" in res.stdout, res.stdout


def test_each_forecast_s_p_within_the_margin_is_in_the_table_the_summary_and_mlflow(efficiency_table, tmp_path):
    """Issue 58: P(the seeds' mean at the target lands within ±margin) is a number in the table, the
    terminal summary and an MLflow tag on every run of the variant, and *predictable* is P >= the level."""
    from mlflow.tracking import MlflowClient

    from analysis.loo import tag_p_within
    from analysis.render import to_markdown
    from analysis.summary import summary
    from runners.tracking import store

    df, table, _, settings = efficiency_table
    t = table.reset_index(drop=True)
    banded = t[t["p_within"].notna()]
    assert len(banded) >= 2 and banded["p_within"].between(0, 1).all()
    for _, r in banded.iterrows():
        assert bool(r["predictable"]) <= (r["p_within"] >= settings.level), r["predictability"]
        assert (
            r["predictable"]
            or "probability" not in r["predictability"]
            or f"{r['p_within']:.2f}" in r["predictability"]
        )
    md = to_markdown(t)
    assert all(f"P {p:.2f}: " in md for p in banded["p_within"])
    text = summary(t, tmp_path, margin=settings.margin)
    head = next(line for line in text.splitlines() if line.startswith("variant"))
    assert " P " in head
    base = next(line for line in text.splitlines() if line.startswith("baseline"))
    p = t.loc[t["variant"] == "baseline", "p_within"].iloc[0]
    assert f"{p:.2f}".lstrip("0") in base
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("c")
    ids = {run: client.create_run(exp, run_name=run).info.run_id for run in df["run"].unique()}
    df = df.assign(run_id=df["run"].map(ids))
    tag_p_within(df, t, client)
    tags = {run: client.get_run(i).data.tags.get(store.P_WITHIN) for run, i in ids.items()}
    assert float(tags["baseline/seed0"]) == pytest.approx(p, abs=1e-3)
    tag_p_within(df, t.drop(columns=["p_within"]), client)
    assert store.P_WITHIN not in client.get_run(ids["baseline/seed0"]).data.tags

"""Adaptive campaigns: the stop rule on curves with known truth, the campaign's adaptive section,
and a real tiny campaign that stops a planted hopeless variant at a checkpoint."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from runners.campaign.adaptive import decide_at
from runners.campaign.load import load_campaign
from runners.campaign.spec import Adaptive, CampaignError, X
from runners.contract import MEAN_AT_16
from scalefit.data.synthetic import realistic_runs
from tests.conftest import empty_store


def campaign_curves(variants: dict[str, tuple[float, float, float]], budget: float = 40_000.0) -> pd.DataFrame:
    """Curves of a campaign from true (A, B, C_mid) per variant: 41 evaluations, 2 seeds, realistic noise."""
    frames = []
    for i, (name, (a, b, cm)) in enumerate(variants.items()):
        df = realistic_runs(cm, b, a, R0=0.35, c_max=budget, n_points=41, seeds=2, drift_sd=0.005, seed=i)
        frames.append(df.assign(variant=name).rename(columns={"compute": X, "value": MEAN_AT_16}))
    return pd.concat(frames, ignore_index=True)


BASE = (0.70, 2.0, 8_000.0)


def test_a_clearly_worse_variant_is_stopped_and_a_close_one_is_not():
    curves = campaign_curves({"baseline": BASE, "worse": (0.55, 2.0, 8_000.0), "close": (0.695, 2.0, 8_000.0)})
    budgets = {v: 40_000.0 for v in ("baseline", "worse", "close")}
    cfg = Adaptive([0.5], margin=0.02, risk=0.05, eval_prompts=1000, n_resamples=300)
    worse = decide_at(curves, "worse", 0.5, budgets, cfg)
    assert worse.stop and worse.probability < 0.05, worse.reason
    assert worse.variant_final == pytest.approx(0.55, abs=0.03) and worse.baseline_final == pytest.approx(
        0.70, abs=0.03
    )
    assert worse.reason.startswith("stop: P(final >= baseline - 0.02)")
    close = decide_at(curves, "close", 0.5, budgets, cfg)
    assert not close.stop and close.probability > 0.05, close.reason


def test_decisions_use_only_points_up_to_the_decision_point():
    curves = campaign_curves({"baseline": BASE, "worse": (0.55, 2.0, 8_000.0)})
    budgets = {"baseline": 40_000.0, "worse": 40_000.0}
    cfg = Adaptive([0.5], eval_prompts=1000, n_resamples=300)
    before = decide_at(curves, "worse", 0.5, budgets, cfg)
    later = curves[X] > 0.5 * 40_000.0
    tampered = curves.copy()
    tampered.loc[later, MEAN_AT_16] = 0.99  # what happens after the point must not matter
    assert decide_at(tampered, "worse", 0.5, budgets, cfg).to_dict() == before.to_dict()


def test_a_variant_that_is_not_yet_predictable_is_never_stopped():
    # before its knee (C_mid past the decision point), however low it looks so far
    curves = campaign_curves({"baseline": BASE, "late": (0.6, 2.0, 25_000.0)})
    d = decide_at(curves, "late", 0.25, {"baseline": 40_000.0, "late": 40_000.0}, Adaptive([0.25], n_resamples=300))
    assert not d.stop and "not yet predictable" in d.reason


def test_a_variant_with_no_gain_is_stopped_once_the_baseline_has_made_its_gain():
    curves = campaign_curves({"baseline": BASE, "flat": (0.36, 2.0, 8_000.0)})  # stays at its start, 0.35
    budgets = {"baseline": 40_000.0, "flat": 40_000.0}
    cfg = Adaptive([0.25, 0.5], eval_prompts=1000, n_resamples=300)
    d = decide_at(curves, "flat", 0.5, budgets, cfg)
    assert d.stop and d.reason.startswith("stop: no gain"), d.reason
    early = decide_at(curves, "flat", 0.05, budgets, cfg)  # the baseline has barely started: no verdict on anyone
    assert not early.stop, early.reason


def test_the_joint_model_decides_by_default_and_pooling_none_fits_each_variant_alone():
    """Several variants sharing B: at the decision point one joint fit of every variant that has
    reached it (baseline included) decides for all of them, and says so; ``fit.pooling: none``
    still fits the variant and the baseline each alone."""
    from runners.campaign.adaptive import PER_VARIANT

    variants = {
        "baseline": BASE,
        "worse": (0.55, 2.0, 8_000.0),
        "close": (0.695, 2.0, 8_000.0),
        "later": (0.70, 2.0, 11_000.0),
    }
    curves = campaign_curves(variants)
    budgets = {v: 40_000.0 for v in variants}
    cfg = Adaptive([0.5], margin=0.02, risk=0.05, eval_prompts=1000, n_resamples=200)
    assert cfg.pooling == "partial"
    cache: dict = {}
    worse = decide_at(curves, "worse", 0.5, budgets, cfg, cache)
    close = decide_at(curves, "close", 0.5, budgets, cfg, cache)
    assert worse.stop and worse.reason.startswith("stop: P(final >= baseline - 0.02)"), worse.reason
    assert not close.stop, close.reason
    for d in (worse, close):
        assert d.fit_model.startswith("pooling partial: B pooled over 4 variants"), d.fit_model
    assert len(cache) == 1  # the two decisions shared one joint fit of the four variants
    ((cfit, fcs),) = cache.values()
    assert set(fcs) == set(variants) and all(f.compute.max() <= 20_000.0 for f in cfit.fits.values())
    assert fcs["worse"].target == 40_000.0  # forecast to the full budget

    alone = Adaptive([0.5], margin=0.02, risk=0.05, eval_prompts=1000, n_resamples=200, pooling="none")
    d = decide_at(curves, "worse", 0.5, budgets, alone)
    assert d.stop and d.fit_model == PER_VARIANT, d


def test_a_curve_the_joint_model_gives_no_band_is_never_stopped_and_the_reason_says_why():
    """A variant that rises then collapses ends far below the baseline, but it is not a sigmoid: the
    joint model gives it no band, so the fitted rule keeps it running and says why."""
    curves = campaign_curves({"baseline": BASE, "other": (0.68, 2.0, 8_000.0), "collapse": BASE})
    late = (curves["variant"] == "collapse") & (curves[X] > 8_000.0)
    curves.loc[late, MEAN_AT_16] -= 0.25 * (curves.loc[late, X] - 8_000.0) / 12_000.0
    budgets = {v: 40_000.0 for v in ("baseline", "other", "collapse")}
    d = decide_at(curves, "collapse", 0.5, budgets, Adaptive([0.5], eval_prompts=1000, n_resamples=200))
    assert not d.stop and d.probability is None
    assert "the variant's curve gets no band (rises then falls" in d.reason and "not a sigmoid" in d.reason, d.reason


def test_the_adaptive_section_carries_the_fit_sections_pooling_and_last_k(tmp_path):
    path = tmp_path / "c.yaml"
    doc = {"name": "c", "baseline": "scalerl", "adaptive": {"at": [0.5]}}
    path.write_text(json.dumps(doc))
    camp = load_campaign(path)
    assert (camp.adaptive.pooling, camp.adaptive.last_k, camp.adaptive.level) == ("partial", 3, 0.9)
    path.write_text(json.dumps({**doc, "fit": {"pooling": "none", "last_k": 2, "level": 0.8}}))
    camp = load_campaign(path)
    assert (camp.adaptive.pooling, camp.adaptive.last_k, camp.adaptive.level) == ("none", 2, 0.8)


@pytest.mark.parametrize(
    "adaptive,msg",
    [
        ({"at": [0.5, 1.5]}, r"adaptive.at = \[0.5, 1.5\]: expected fractions of the budget in \(0, 1\)"),
        ({"at": []}, "adaptive.at"),
        ({"at": [0.5], "risk": 0.7}, r"adaptive.risk = 0.7: expected a probability in \(0, 0.5\)"),
        ({"at": [0.5], "margin": -1}, "adaptive.margin = -1"),
        ({"at": [0.5], "rsk": 0.1}, "adaptive: unknown key 'rsk'"),
        ([0.5], "adaptive = \\[0.5\\]: expected"),
    ],
)
def test_bad_adaptive_sections_get_one_clear_line(tmp_path, adaptive, msg):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"name": "c", "baseline": "scalerl", "adaptive": adaptive}))
    with pytest.raises(CampaignError, match=msg):
        load_campaign(path)


def test_adaptive_decides_on_completions_not_wall_clock(tmp_path):
    path = tmp_path / "c.yaml"
    doc = {"name": "c", "baseline": "scalerl", "adaptive": {"at": [0.5]}, "fit": {"x": "compute/gpu_hours"}}
    path.write_text(json.dumps(doc))
    with pytest.raises(CampaignError, match="adaptive campaigns decide on fit.x = compute/samples"):
        load_campaign(path)
    doc["fit"] = {"margin": 0.03}
    path.write_text(json.dumps(doc))
    camp = load_campaign(path)
    assert camp.adaptive.at == [0.5] and camp.adaptive.margin == 0.03 and camp.adaptive.risk == 0.05
    assert np.isclose(camp.adaptive.margin, 0.03)


@pytest.mark.slow
def test_a_stop_decision_ends_the_run_at_a_checkpoint_stays_and_resumes_on_request(tmp_path, store):
    """A stop decision recorded by a campaign killed before it could act (the decision tag is on the
    variant's run, no STOP file yet): the next campaign takes the same decision, the run ends at a
    checkpoint with its history kept, a re-run leaves it stopped, --resume-stopped finishes it."""
    from mlflow.tracking import MlflowClient

    from runners.campaign.adaptive import decision_tag
    from runners.campaign.load import expand
    from runners.campaign.runs import child_run, run_campaign
    from runners.tracking import store as prl_store
    from tests.campaigns import history_steps, write_campaign

    path = write_campaign(
        tmp_path / "a.yaml",
        "adaptive-tiny",
        8,
        {"loss": {"key": "algorithm.loss", "values": ["cispo", "dapo"]}},
        fit={"a_grid": "0.05:1.0:0.005"},
        adaptive={"at": [0.5], "risk": 0.05},
    )
    camp = load_campaign(path)
    variant = next(s for s in expand(camp) if s.variant == "loss=dapo")
    client = MlflowClient(store)
    run_id = child_run(client, camp, variant).info.run_id
    decision = {"stop": True, "reason": "stop: recorded before a kill", "probability": 0.01}
    client.set_tag(run_id, decision_tag(0.5), json.dumps(decision))

    lines: list[str] = []
    summary = run_campaign(path, log=lines.append)
    assert not summary["failures"]
    run = client.get_run(run_id)
    assert run.data.tags[prl_store.STOPPED] == "1" and prl_store.DONE not in run.data.tags
    steps = history_steps(client, run_id, "train/loss")
    assert steps and max(steps) < 8  # ended early
    folder = next((tmp_path / "artifacts/campaigns/adaptive-tiny").glob("loss-dapo-seed0-*"))
    assert (folder / "STOP").is_file() and any(folder.glob("checkpoints/checkpoint-*/prl_state.json"))
    assert summary["adaptive"]["share_saved"] > 0
    assert any("compute not spent" in x for x in lines)
    assert any("stopped at step" in x for x in lines)  # the run's own line, echoed by the campaign

    again: list[str] = []
    assert run_campaign(path, log=again.append)["ran"] == 0  # stopped stays stopped
    assert any("1 stopped, 0 to run" in x for x in again)

    resumed = run_campaign(path, resume_stopped=True, log=lambda m: None)
    assert resumed["ran"] == 1 and not resumed["failures"]
    run = client.get_run(run_id)
    assert run.data.tags[prl_store.DONE] == "1" and run.data.tags[prl_store.STOPPED] == "0"
    assert history_steps(client, run_id, "train/loss") == list(range(1, 9))  # each step once, no splice
    samples = [m.value for m in sorted(client.get_metric_history(run_id, X), key=lambda m: m.step)]
    assert samples == sorted(samples) and len(samples) == len(set(history_steps(client, run_id, MEAN_AT_16)))


def test_a_stop_recorded_on_one_seed_before_a_kill_reaches_every_seed(tmp_path, store_template):
    """A kill between tagging one seed's run and the next: the next campaign's monitor applies the
    recorded stop to every run of the variant (tags and STOP files), not only the tagged one."""
    from mlflow.tracking import MlflowClient

    from runners.campaign.adaptive import Monitor, decision_tag
    from runners.campaign.backends.local import run_folder
    from runners.campaign.load import expand
    from runners.campaign.runs import child_run
    from runners.tracking import store
    from tests.campaigns import write_campaign

    camp = load_campaign(
        write_campaign(
            tmp_path / "a.yaml",
            "partial",
            8,
            {"loss": {"key": "algorithm.loss", "values": ["cispo", "dapo"]}},
            seeds=[0, 1],
            fit={"a_grid": "0.05:1.0:0.005"},
            adaptive={"at": [0.5]},
        )
    )
    client = MlflowClient(empty_store(store_template, tmp_path / "mlflow.db"))
    members: dict[str, list] = {}
    for spec in expand(camp):
        run = child_run(client, camp, spec)
        members.setdefault(spec.variant, []).append((run.info.run_id, run_folder(tmp_path, spec), 64.0))
    decision = {"stop": True, "reason": "stop: recorded before a kill", "probability": 0.01}
    client.set_tag(members["loss=dapo"][0][0], decision_tag(0.5), json.dumps(decision))

    monitor = Monitor(camp.adaptive, client, members, log=lambda m: None)
    assert monitor.stopped == {"loss=dapo"}
    for run_id, folder, _ in members["loss=dapo"]:
        tags = client.get_run(run_id).data.tags
        assert (
            json.loads(tags[decision_tag(0.5)])["stop"] is True
            and "recorded before a kill" in tags[store.STOP_DECISION]
        )
        assert json.loads((folder / "STOP").read_text())["reason"] == "stop: recorded before a kill"
    for _, folder, _ in members["baseline"]:
        assert not (folder / "STOP").exists()


def test_a_gap_far_beyond_the_backtest_error_stops_a_variant_that_is_not_predictable_within_the_margin():
    """On the recorded GPU study: the think_12 control (0.16 below the baseline) has a backtest
    error above the margin, yet from 60% of the budget the gap survives moving both predictions by
    their errors and the variant's up by how far its open ceiling lets it rise; at half the budget
    its runs still steepen over their last doubling (the knee from the data) and, with a ceiling of
    1, it could end within the risk of the baseline: it keeps running, saying so. The lr_half
    control (before its knee, A on the grid edge) is never stopped on its fit; fp32=off, close to
    the baseline, keeps running. That is the per-variant fit (``fit.pooling: none``); the joint
    model's half-budget fit of this study has no backtest past the knee, so its extrapolation is
    unchecked and it stops nothing on it."""
    from pathlib import Path

    curves = pd.read_csv(Path(__file__).parents[1] / "results/loo-gpu2/curves.csv")
    budgets = curves.groupby("variant")[X].max().to_dict()
    cfg = Adaptive([0.5], margin=0.02, risk=0.05, eval_prompts=1000, n_resamples=400, pooling="none")
    think = decide_at(curves, "control=think_12", 0.6, budgets, replace(cfg, at=[0.6]))
    assert think.stop and "moved towards each other by their backtest errors" in think.reason, think.reason
    steepening = decide_at(curves, "control=think_12", 0.5, budgets, cfg)
    assert not steepening.stop and "its data do not show its knee" in steepening.reason, steepening.reason
    joint = decide_at(curves, "control=think_12", 0.5, budgets, replace(cfg, pooling="partial"))
    assert not joint.stop and "its extrapolation is unchecked" in joint.reason, joint.reason
    slow = decide_at(curves, "control=lr_half", 0.5, budgets, cfg)
    assert not slow.stop and "not yet predictable" in slow.reason
    close = decide_at(curves, "fp32=off", 0.5, budgets, cfg)
    assert not close.stop and close.probability > 0.05


def test_a_flat_variant_stops_on_no_gain_against_a_baseline_whose_only_flaw_is_its_backtest_error():
    """On the third GPU study: think_8 never rises (no sigmoid to fit) while the baseline, identified
    but with an expected error above the margin (the joint model's k-seed band wider than it), is
    predicted far above it even after that error;
    lr_half (slower, same plateau) keeps running."""
    from pathlib import Path

    curves = pd.read_csv(Path(__file__).parents[1] / "results/loo-gpu3/curves.csv")
    budgets = curves.groupby("variant")[X].max().to_dict()
    cfg = Adaptive([0.5], margin=0.02, risk=0.05, eval_prompts=500, n_resamples=400)
    flat = decide_at(curves, "control=think_8", 0.5, budgets, cfg)
    assert flat.stop and flat.reason.startswith("stop: no gain") and "after its expected error" in flat.reason
    slow = decide_at(curves, "control=lr_half", 0.5, budgets, cfg)
    assert not slow.stop


def test_the_live_monitor_reads_the_store_waits_for_every_seed_and_stops_the_worse_variant(tmp_path, store_template):
    """The monitor as a campaign runs it: curves logged into a real MLflow store as runs log them,
    no decision until every seed of the variant and of the baseline has reached the point, then
    the worse variant stopped (tags and STOP files) and the close one left running."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from runners.campaign.adaptive import Monitor, decision_tag
    from runners.tracking import store

    budget = 40_000.0
    curves = campaign_curves({"baseline": BASE, "worse": (0.55, 2.0, 8_000.0), "close": (0.695, 2.0, 8_000.0)})
    client = MlflowClient(empty_store(store_template, tmp_path / "mlflow.db"))
    exp = client.create_experiment("live")
    members: dict[str, list] = {}
    series: dict[str, pd.DataFrame] = {}
    for (variant, seed), g in curves.groupby(["variant", "seed"]):
        run_id = client.create_run(exp).info.run_id
        members.setdefault(variant, []).append((run_id, tmp_path / f"{variant}-{seed}", budget))
        (tmp_path / f"{variant}-{seed}").mkdir()
        series[run_id] = g.sort_values(X).reset_index(drop=True)

    def log_upto(fraction: float, skip: str | None = None) -> None:
        for run_id, g in series.items():
            if run_id == skip:
                continue
            done = {m.step for m in client.get_metric_history(run_id, X)}
            rows = g[(g[X] <= fraction * budget) & ~g.index.isin(done)]
            metrics = [Metric(key, float(r[key]), 0, int(i)) for i, r in rows.iterrows() for key in (X, MEAN_AT_16)]
            for start in range(0, len(metrics), 1000):
                client.log_batch(run_id, metrics=metrics[start : start + 1000])

    cfg = Adaptive([0.5], margin=0.02, risk=0.05, eval_prompts=1000, n_resamples=300)
    monitor = Monitor(cfg, client, members, log=lambda m: None)
    lagging = members["baseline"][1][0]
    log_upto(0.6, skip=lagging)  # one baseline seed is still short of the decision point
    log_upto(0.4)
    monitor(force=True)
    assert not monitor.decided and not monitor.stopped
    log_upto(0.6)
    monitor(force=True)
    assert monitor.stopped == {"worse"} and set(monitor.decided) == {("worse", 0.5), ("close", 0.5)}
    for run_id, folder, _ in members["worse"]:
        assert (folder / "STOP").is_file() and store.STOP_DECISION in client.get_run(run_id).data.tags
    for run_id, folder, _ in members["close"]:
        assert not (folder / "STOP").exists()
        assert json.loads(client.get_run(run_id).data.tags[decision_tag(0.5)])["stop"] is False
    assert monitor.saved()["share_saved"] > 0


def test_the_shipped_adaptive_campaign_is_loo_gpu5_with_decision_points():
    """experiments/campaigns/loo-gpu5-adaptive.yaml: the feature in use, on the study whose full runs
    are published (results/loo-gpu5): the same runs, recipe for recipe and seed for seed."""
    from runners.campaign.load import expand

    adaptive, full = load_campaign("loo-gpu5-adaptive"), load_campaign("loo-gpu5")
    assert adaptive.adaptive == Adaptive(at=[0.25, 0.5], margin=0.02, risk=0.05, eval_prompts=300)

    def runs(camp) -> list[str]:
        return sorted(
            json.dumps({**s.recipe.to_dict(), "name": s.variant}, sort_keys=True, default=str) for s in expand(camp)
        )

    assert len(runs(adaptive)) == 25 and runs(adaptive) == runs(full)


def test_a_variant_that_cannot_be_fitted_is_judged_against_a_power_law_baseline():
    """A variant with too few points to fit, against a power-law baseline (fit.model: power_law): its
    no-gain rule counts the baseline's gain from the level its declaration gives, else the measured
    one; it read the sigmoid's R0, which a power law lacks (AttributeError)."""
    curves = campaign_curves({"baseline": BASE, "flat": (0.36, 2.0, 8_000.0)})
    curves = curves[(curves["variant"] == "baseline") | (curves[X] <= 1_000.0)]  # the flat one: too few points
    budgets = {"baseline": 40_000.0, "flat": 40_000.0}
    cfg = Adaptive([0.5], eval_prompts=1000, n_resamples=300, pooling="none", model="power_law")
    d = decide_at(curves, "flat", 0.5, budgets, cfg)
    assert d.stop and d.reason.startswith("stop: no gain") and "has made 8" in d.reason, d.reason
    assert d.baseline_final == pytest.approx(0.70, abs=0.05)

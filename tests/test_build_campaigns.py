"""A campaign's ``builds: N`` (issue 62, item 1): every variant x seed on each of N independent
base-model builds (``model.build_seed`` 1..N, seed S of build B as train.seed B*1000+S), refused in
one line where it cannot hold, fitted end to end with its builds reported (builds.md), and its runs
checked for instability against their own build's runs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from analysis.curves import unstable_points
from runners.campaign.load import expand, load_campaign
from runners.campaign.runs import run_campaign
from runners.campaign.spec import CampaignError
from runners.contract import MEAN_AT_16
from runners.tracking import store
from tests.campaigns import write_campaign

AXES = {"loss": {"key": "algorithm.loss", "values": ["dapo", "gspo"]}}


def test_builds_expand_every_variant_and_seed_on_each_build_with_distinct_seeds_and_identities(tmp_path):
    camp = load_campaign(write_campaign(tmp_path / "b.yaml", "b", 4, AXES, seeds=[0, 1], builds=3))
    specs = expand(camp)
    assert [(s.variant, s.build, s.seed) for s in specs] == [
        (v, b, b * 1000 + s) for v in ("baseline", "loss=dapo", "loss=gspo") for b in (1, 2, 3) for s in (0, 1)
    ]
    for s in specs:
        assert (s.recipe.model.build_seed, s.recipe.train.seed) == (s.build, s.seed)
        assert s.name == f"{s.variant}/seed{s.seed}/build{s.build}"
    assert len({s.run_key for s in specs}) == len(specs) == 18
    # one run per (variant, seed): the unit every seed-wise analysis resamples stays one run
    assert len({(s.variant, s.seed) for s in specs}) == len(specs)
    # a build's runs are the same whatever the number of builds: builds 3 -> 4 only adds build 4's runs
    four = expand(load_campaign(write_campaign(tmp_path / "b4.yaml", "b", 4, AXES, seeds=[0, 1], builds=4)))
    assert {s.run_key for s in specs} < {s.run_key for s in four}


def test_one_build_is_the_campaign_without_the_key(tmp_path):
    plain = expand(load_campaign(write_campaign(tmp_path / "p.yaml", "c", 4, AXES, seeds=[0, 1])))
    one = expand(load_campaign(write_campaign(tmp_path / "o.yaml", "c", 4, AXES, seeds=[0, 1], builds=1)))
    assert [(s.variant, s.seed, s.run_key, s.name) for s in one] == [
        (s.variant, s.seed, s.run_key, s.name) for s in plain
    ]
    assert all(s.build is None and s.recipe.model.build_seed is None for s in one)
    assert plain[0].name == "baseline/seed0"


def test_builds_in_a_scale_campaign_build_each_size_n_times(tmp_path):
    path = write_campaign(tmp_path / "s.yaml", "s", 4, {}, kind="scale", sizes=["tiny", "pico"], builds=2)
    doc = json.loads(path.read_text())
    del doc["overrides"]["model.size"]  # the sizes set it
    path.write_text(json.dumps(doc))
    specs = expand(load_campaign(path))
    got = [(s.value, s.recipe.model.size, s.build, s.seed) for s in specs]
    assert got == [(z, z, b, b * 1000) for z in ("tiny", "pico") for b in (1, 2)]


@pytest.mark.parametrize(
    "extra,msg",
    [
        ({"builds": 0}, r"builds = 0: expected a whole number >= 1, e.g. builds: 3"),
        ({"builds": -2}, r"builds = -2: expected a whole number >= 1"),
        ({"builds": 1.5}, r"builds = 1.5: expected a whole number >= 1"),
        ({"builds": "3"}, r"builds = '3': expected a whole number >= 1"),
        ({"builds": True}, r"builds = True: expected a whole number >= 1"),
        (
            {"builds": 2, "overrides": {"model.size": "tiny", "model.build_seed": 4}},
            r"overrides sets model.build_seed and builds = 2 sets it too .*: remove one",
        ),
        (
            {"builds": 2, "axes": {"b": {"key": "model.build_seed", "values": [1, 2]}}},
            r"axis 'b' sets model.build_seed and builds = 2 sets it too",
        ),
        (
            {"builds": 2, "controls": {"other": {"model.build_seed": 7}}},
            r"control 'other' sets model.build_seed and builds = 2 sets it too",
        ),
        ({"builds": 2, "seeds": [0, 1000]}, r"seeds lists 1000, but with builds = 2 .*use seeds in \[0, 999\]"),
        ({"builds": 2, "baseline_seeds": [5000]}, r"baseline_seeds lists 5000, but with builds = 2"),
        (
            {"builds": 2, "overrides": {"model.size": None, "model.path": "/weights"}},
            r"builds = 2 builds each embedded size 2 times, but baseline 'scalerl' loads model.path: use a recipe",
        ),
    ],
)
def test_bad_builds_are_refused_in_one_line_before_anything_runs(tmp_path, cli, extra, msg):
    extra = dict(extra)
    path = write_campaign(tmp_path / "bad.yaml", "bad", 4, extra.pop("axes", {}), **extra)
    with pytest.raises(CampaignError, match=msg) as e:
        expand(load_campaign(path))
    assert "\n" not in str(e.value)
    r = cli("runners", "campaign", str(path), "--dry-run")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1, r.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_a_scale_size_that_sets_the_build_seed_is_refused_with_builds(tmp_path):
    path = write_campaign(
        tmp_path / "s.yaml", "s", 4, {}, kind="scale", sizes={"tiny": {"model.build_seed": 3}, "pico": {}}, builds=2
    )
    doc = json.loads(path.read_text())
    del doc["overrides"]["model.size"]
    path.write_text(json.dumps(doc))
    with pytest.raises(CampaignError, match="sizes: 'tiny' sets model.build_seed and builds = 2 sets it too"):
        load_campaign(path)


def test_the_dry_run_lists_each_run_with_its_build(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_campaign(tmp_path / "b.yaml", "b", 4, {}, seeds=[0, 1], builds=2)
    r = cli("runners", "campaign", str(path), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "4 runs (loo, seeds [0, 1], 2 builds: seed S of build B is B*1000+S)" in r.stdout
    for build, seed in ((1, 1000), (1, 1001), (2, 2000), (2, 2001)):
        assert any(f"seed {seed}  build {build}  id " in x for x in r.stdout.splitlines()), r.stdout


@pytest.mark.slow  # two base-model builds of tiny (build seeds 1 and 2) besides the session's
def test_a_campaign_of_two_builds_runs_on_each_and_its_fit_reports_both(own_store, tmp_path, cli):
    path = write_campaign(tmp_path / "two.yaml", "two-builds", 2, {}, builds=2)
    lines: list[str] = []
    assert not run_campaign(path, log=lines.append)["failures"], lines
    client = MlflowClient(own_store)
    exp = store.experiment_id(client, "two-builds")
    runs = {r.info.run_name: r for r in client.search_runs([exp]) if store.RUN_ID in r.data.tags}
    assert set(runs) == {"baseline/seed1000/build1", "baseline/seed2000/build2"}
    weights = {name: r.data.tags[store.BASE_WEIGHTS] for name, r in runs.items()}
    assert len(set(weights.values())) == 2  # two independent builds: other weights
    assert {r.data.params["model.build_seed"] for r in runs.values()} == {"1", "2"}

    r = cli("analysis", "fit", str(path), "--out", str(tmp_path / "fit"))
    assert r.returncode == 0, r.stderr
    curves = pd.read_csv(tmp_path / "fit" / "curves.csv")
    by_run = curves.groupby("run")[["seed", "build"]].first()
    assert by_run.to_dict("index") == {
        name: {"seed": int(name.split("/seed")[1].split("/")[0]), "build": w[:12]} for name, w in weights.items()
    }
    text = (tmp_path / "fit" / "builds.md").read_text()
    listed = [x for x in text.splitlines() if x.startswith("| ") and x.endswith(" | 1 | baseline |")]
    assert sorted(x.split(" | ")[0][2:] for x in listed) == sorted(w[:12] for w in weights.values())
    assert "| baseline | 2 | 2 |" in text  # the baseline: 2 builds, 2 runs


def _four_builds(collapse: bool) -> pd.DataFrame:
    """A variant's curves on 4 builds x 2 seeds, as results/builds-gpu measured them (levels apart by
    builds, ~10x the seeds' spread): build a is 0.14 above the others; with ``collapse``, seed 3001 of
    build c drops to 0.02 from step 80."""
    rows = []
    for b, level in enumerate((0.74, 0.60, 0.61, 0.59)):
        for s in (0, 1):
            seed = (b + 1) * 1000 + s
            for step in range(0, 101, 10):
                y = 0.43 + (level + (0.006 if s else -0.006) - 0.43) * (1 - np.exp(-step / 30))
                y += 0.003 * np.sin(step + seed)  # evaluation noise
                if collapse and seed == 3001 and step >= 80:
                    y = 0.02
                rows.append(
                    {"run": f"baseline/seed{seed}/build{b + 1}", "variant": "baseline", "seed": seed,
                     "step": step, MEAN_AT_16: y, "build": "abcd"[b] * 12}
                )  # fmt: skip
    return pd.DataFrame(rows)


def test_a_build_above_the_others_is_not_an_unstable_run_but_a_collapse_within_a_build_is():
    hit, flags = unstable_points(_four_builds(collapse=False))
    assert flags == [] and not hit.any()  # build a's runs move together: its level, not instability
    hit, flags = unstable_points(_four_builds(collapse=True))
    assert [(f.seed, f.steps, f.collapsed, f.recovered) for f in flags] == [(3001, [80, 90, 100], True, False)]
    # a build of one seed cannot tell its level from instability: its run keeps the flag
    alone = _four_builds(collapse=True)
    alone = alone[alone["seed"] != 3000]
    assert [f.seed for f in unstable_points(alone)[1]] == [3001]

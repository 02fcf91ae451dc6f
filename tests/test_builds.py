"""The base model as a measured factor (issue 59): every run carries the sha256 of the weights it
started from; a campaign whose cache holds other weights under a build its runs used is refused in
one line; a machine with a cache of its own takes the campaign's build from its store instead of
building one; build seeds make independent builds; analysis reports levels and differences by build."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from analysis import builds
from runners.campaign.runs import run_campaign
from runners.campaign.spec import CampaignError
from runners.contract import MEAN_AT_16
from runners.identity import run_key
from runners.recipe import RecipeError, load_recipe
from runners.task.basemodel import deterministic_algorithms
from runners.task.sizes import base_model_path, build_key
from runners.task.tasks import ArithmeticTask
from runners.task.weights import base_weights, weights_sha256
from runners.tracking import store
from tests.campaigns import write_campaign
from tests.conftest import empty_store

NAME = "builds"


def _campaign(folder: Path, seeds: list[int]) -> Path:
    return write_campaign(folder / f"c{'-'.join(map(str, seeds))}.yaml", NAME, 2, {}, seeds=seeds)


def _cache_with_tiny(folder: Path, tiny_base: Path) -> Path:
    """A base-model cache of its own (another machine's) holding the session's tiny build."""
    shutil.copytree(tiny_base, folder / "base-models" / tiny_base.name)
    return folder


@pytest.fixture(scope="module")
def first_machine(tmp_path_factory, tiny_base, store_template) -> dict:
    """A campaign's first run (seed 0), trained on a machine whose cache holds the tiny build: its
    folder (store, artifacts), and the weights it started from."""
    root = tmp_path_factory.mktemp("builds")
    cache = _cache_with_tiny(root / "cache-a", tiny_base)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("PRL_CACHE", str(cache))
        mp.setenv("MLFLOW_TRACKING_URI", empty_store(store_template, root / "mlflow.db"))
        lines: list[str] = []
        assert not run_campaign(_campaign(root, [0]), log=lines.append)["failures"], lines
    return {"root": root, "weights": base_weights(cache / "base-models" / tiny_base.name), "lines": lines}


def _runs(root: Path) -> list:
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = store.experiment_id(client, NAME)
    return [r for r in client.search_runs([exp]) if store.RUN_ID in r.data.tags]


def test_every_run_carries_its_base_weights_and_the_parent_records_them(first_machine, tiny_base):
    (run,) = _runs(first_machine["root"])
    assert run.data.tags[store.BASE_WEIGHTS] == first_machine["weights"] == weights_sha256(tiny_base)
    assert run.data.tags[store.BASE_MODEL] == tiny_base.name
    client = MlflowClient(f"sqlite:///{first_machine['root'] / 'mlflow.db'}")
    parent = store.parent_run(client, store.experiment_id(client, NAME))
    assert parent.data.tags[store.BASE_WEIGHTS_OF + tiny_base.name] == first_machine["weights"]
    logged = [a.path for a in client.list_artifacts(parent.info.run_id, f"{store.BASE_MODELS_DIR}/{tiny_base.name}")]
    assert any(p.endswith("model.safetensors") for p in logged), logged  # the build travels with the store


@pytest.mark.slow  # a second campaign's run: ~1 min on 2 cores
def test_a_second_machine_with_its_own_empty_cache_takes_the_campaigns_build_from_the_store(
    first_machine, tiny_base, tmp_path, monkeypatch
):
    root = first_machine["root"]
    cache = tmp_path / "cache-b"  # another machine: nothing built there
    monkeypatch.chdir(root)
    monkeypatch.setenv("PRL_CACHE", str(cache))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
    lines: list[str] = []
    assert not run_campaign(_campaign(tmp_path, [0, 1]), log=lines.append)["failures"], lines
    assert not any("building base model" in x for x in lines), lines  # it built nothing of its own
    assert any("from its store" in x for x in lines), lines
    assert base_weights(cache / "base-models" / tiny_base.name) == first_machine["weights"]
    assert {r.data.tags[store.BASE_WEIGHTS] for r in _runs(root)} == {first_machine["weights"]}


def test_a_rebuilt_base_model_with_other_weights_under_the_same_key_is_refused_in_one_line(
    first_machine, tiny_base, tmp_path, monkeypatch
):
    from safetensors.torch import load_file, save_file

    root = first_machine["root"]
    cache = _cache_with_tiny(tmp_path / "cache-c", tiny_base)
    rebuilt = cache / "base-models" / tiny_base.name  # the same key, built again: other weights
    weights = load_file(rebuilt / "model.safetensors")
    save_file({k: v + 1e-3 for k, v in weights.items()}, rebuilt / "model.safetensors", metadata={"format": "pt"})
    info = json.loads((rebuilt / "build_info.json").read_text())
    info["weights_sha256"] = weights_sha256(rebuilt)
    (rebuilt / "build_info.json").write_text(json.dumps(info))
    monkeypatch.chdir(root)
    monkeypatch.setenv("PRL_CACHE", str(cache))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
    before = len(_runs(root))
    with pytest.raises(CampaignError) as e:
        run_campaign(_campaign(tmp_path, [0, 2]), log=lambda m: None)
    text = str(e.value)
    assert "\n" not in text
    assert first_machine["weights"][:12] in text and info["weights_sha256"][:12] in text, text
    assert "make import" in text and "new campaign" in text, text
    assert len(_runs(root)) == before  # refused before any run of the other weights was made


def test_a_campaigns_run_on_a_node_whose_cache_holds_other_weights_refuses(tiny_base, tmp_path, monkeypatch):
    """A node never trains from weights other than its campaign's (``PRL_BASE_WEIGHTS``)."""
    from runners.tracking.basemodels import BaseModelMismatch, ready

    recipe = load_recipe("scalerl", {"model.size": "tiny"})
    cache = _cache_with_tiny(tmp_path / "node", tiny_base)
    monkeypatch.setenv("PRL_CACHE", str(cache))
    monkeypatch.setenv(store.EXPECTED_WEIGHTS, "0" * 64)
    with pytest.raises(BaseModelMismatch, match="started from weights 000000000000, but .* holds weights"):
        ready(MlflowClient("sqlite:///" + str(tmp_path / "x.db")), "no-run", recipe, log=lambda m: None)
    monkeypatch.setenv(store.EXPECTED_WEIGHTS, weights_sha256(tiny_base))
    assert ready(MlflowClient("sqlite:///" + str(tmp_path / "x.db")), "no-run", recipe, log=pytest.fail) == (
        tiny_base.name,
        weights_sha256(tiny_base),
    )


def test_a_build_seed_names_an_independent_build_and_leaves_other_identities_unchanged():
    task = ArithmeticTask()
    assert build_key("tiny", task, None) == build_key("tiny", task)
    assert len({build_key("tiny", task, s) for s in (None, 0, 1)}) == 3
    assert base_model_path("tiny", task, Path("c"), 1).name == f"tiny-{build_key('tiny', task, 1)}"
    plain = load_recipe("scalerl")
    assert plain.model.build_seed is None
    seeded = load_recipe("scalerl", {"model.build_seed": 1})
    assert run_key(seeded) != run_key(plain)
    resolved = plain.to_dict()
    del resolved["model"]["build_seed"]  # a run recorded before build seeds keeps its identity
    import hashlib

    from runners.identity import code_version, idle_loss_settings

    for key in idle_loss_settings(plain):  # nor SAPO's settings (tests/test_losses.py)
        del resolved["algorithm"][key]

    blob = json.dumps(
        {"recipe": resolved, "code": code_version(), "base": build_key("small", plain.data.task)},
        sort_keys=True,
        default=str,
    )
    assert run_key(plain) == hashlib.sha256(blob.encode()).hexdigest()[:16]
    with pytest.raises(RecipeError, match="model.build_seed = -1"):
        load_recipe("scalerl", {"model.build_seed": -1})
    with pytest.raises(RecipeError, match="model.build_seed"):
        load_recipe("scalerl", {"model.build_seed": 1, "model.size": None, "model.path": "/x"})


def test_deterministic_builds_restore_the_processes_own_setting():
    import torch

    assert not torch.are_deterministic_algorithms_enabled()
    with deterministic_algorithms():
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
    with deterministic_algorithms(False):
        assert not torch.are_deterministic_algorithms_enabled()


def _curves(level: dict[tuple[str, str], float], seeds: int = 2) -> pd.DataFrame:
    rows = []
    for (variant, build), y in level.items():
        for s in range(seeds):
            for step in range(5):
                rows.append(
                    {
                        "variant": variant,
                        "build": build,
                        "seed": s + 10 * len(build),
                        "step": step,
                        MEAN_AT_16: y + (0.01 if s else -0.01) + (0 if step >= 2 else -0.2),
                    }
                )
    return pd.DataFrame(rows)


def test_levels_and_differences_are_reported_by_build_with_their_spread():
    levels = {("baseline", "b1"): 0.70, ("baseline", "b22"): 0.60, ("arm", "b1"): 0.82, ("arm", "b22"): 0.74}
    curves = _curves(levels)
    table = builds.by_build(curves).set_index("variant")
    assert table.loc["baseline", "level"] == pytest.approx(0.65)
    assert table.loc["baseline", "between_build_sd"] == pytest.approx(np.std([0.70, 0.60], ddof=1))
    assert table.loc["baseline", "within_build_sd"] == pytest.approx(np.std([-0.01, 0.01], ddof=1))
    assert table.loc["arm", "delta"] == pytest.approx(0.13)  # each build against its own baseline
    assert table.loc["arm", "delta_between_build_sd"] == pytest.approx(np.std([0.12, 0.14], ddof=1))
    assert "2 base-model builds" in builds.mixed(curves)
    assert builds.mixed(curves[curves["build"] == "b1"]) is None
    assert "| arm | 2 | 4 | 0.780 | 0.057 | 0.014 |  |  | +0.130 | 0.014 | 0.010 |" in builds.markdown(curves)
    column = builds.column(curves).set_index("variant")["builds"]
    assert column["arm"] == "b1;b22"
    assert builds.line(column.reset_index()).startswith("base models: 2 builds (b1, b22)")
    assert "the baseline's level sd 0.071 between them" in builds.line(builds.column(curves))
    assert builds.column(curves.drop(columns="build")) is None

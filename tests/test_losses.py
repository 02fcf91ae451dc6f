"""Losses as plug-ins (runners/losses): a loss's settings are recipe keys with their checks, an
epsilon given to SAPO is explained, a new loss's settings leave every recorded run's identity as it
was, and a new loss is one module, as docs/extending.md writes it: its code block, dropped into the
losses folder with nothing else changed, trains a real run. Each loss's TRL arguments, the loss TRL
computes, its aggregation and a real run with SAPO are its axis's tests in tests/test_axes.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runners.identity import code_version, run_key
from runners.losses import LOSSES, Loss, Setting, positive, register
from runners.recipe import RecipeError, load_recipe
from tests.conftest import documented_module

ROOT = Path(__file__).resolve().parents[1]

# run_key of recipes at 2fcc9df, before losses carried their own settings (issue 61)
RECORDED = {
    ("scalerl", ()): "95e16ffa50c60e2d",
    ("scalerl-gpu", ()): "c5b2834a7b47338a",
    ("scalerl", (("algorithm.loss", "dapo"),)): "c34fc3f117722d13",
    ("scalerl-gpu", (("algorithm.loss", "dapo"),)): "cd71e1b83907d2d2",
    ("scalerl", (("algorithm.loss", "gspo"), ("algorithm.gspo_epsilon", (0.001, 0.002)))): "5456063727b17b1d",
    ("scalerl-gpu", (("algorithm.cispo_epsilon_max", 4.0), ("train.seed", 3))): "5bb1861d1dc69919",
}


def test_the_identities_of_runs_recorded_before_sapo_are_unchanged():
    """A campaign reuses a finished run while its identity is unchanged: adding SAPO's settings to
    every recipe must rename no cispo, dapo or gspo run."""
    assert code_version() == "run2-build1", "RUN_VERSION or BUILD_VERSION was bumped on purpose: record RECORDED anew"
    for (name, overrides), key in RECORDED.items():
        assert run_key(load_recipe(name, {k: list(v) if isinstance(v, tuple) else v for k, v in overrides})) == key


def test_a_new_losss_settings_name_a_run_only_where_they_matter():
    """SAPO's temperatures at their defaults leave a cispo run's identity alone; changed, or SAPO
    running, they name the run (two temperatures are two runs)."""
    plain = run_key(load_recipe("scalerl"))
    assert run_key(load_recipe("scalerl", {"algorithm.sapo_temperature_neg": 1.05})) == plain
    assert run_key(load_recipe("scalerl", {"algorithm.sapo_temperature_neg": 2.0})) != plain
    sapo = {"algorithm.loss": "sapo"}
    assert run_key(load_recipe("scalerl", sapo)) != run_key(
        load_recipe("scalerl", {**sapo, "algorithm.sapo_temperature_pos": 0.5})
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            {"algorithm.sapo_temperature_neg": 0},
            r"^algorithm.sapo_temperature_neg = 0.0: must be > 0 \(paper: 1.0 for positive and 1.05 for negative"
            r" advantages\)$",
        ),
        (
            {"algorithm.loss": "sapo", "algorithm.sapo_epsilon": [0.2, 0.28]},
            r"^unknown key 'algorithm.sapo_epsilon': the sapo loss has no such setting \(no clip: a soft gate on the "
            r"ratio, whose temperatures are its settings\); its settings are: algorithm.sapo_temperature_pos, "
            r"algorithm.sapo_temperature_neg$",
        ),
        ({"algorithm.loss": "ppo"}, r"^algorithm.loss = 'ppo' is not allowed; choose one of: cispo, dapo, gspo, sapo$"),
    ],
)
def test_a_losss_settings_are_checked_naming_the_fix(overrides, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe("scalerl", overrides)


def test_a_loss_whose_settings_or_normaliser_do_not_fit_is_refused_when_registered():
    setting = Setting("temp", 1.0, positive())
    with pytest.raises(ValueError, match=r"setting 'temp' must start with 'mine_'"):
        register(Loss("mine", "grpo", "token", "token_sum", (setting,), lambda temp: {}))
    with pytest.raises(ValueError, match=r"normaliser 'sequence_sum' is not one aggregation_weights knows"):
        register(Loss("mine", "luspo", "sequence", "sequence_sum", (), dict))  # type: ignore[arg-type]
    assert "mine" not in LOSSES


PROBE = """
import json, sys
import runners.losses as losses
losses.__path__.append(sys.argv[1])
losses.scan()
from runners.recipe import RecipeError, load_recipe
from runners.rl.plan import format_plan, trl_args
from runners.rl.train import train

said = {"losses": list(losses.LOSSES)}
try:
    load_recipe("scalerl", {"algorithm.loss": "grpo", "algorithm.grpo_epsilon": [0, 0.2]})
except RecipeError as e:
    said["refused"] = str(e)
tiny = {"model.size": "tiny", "batch.prompts": 2, "batch.generations": 4, "batch.micro_batch": 8,
        "length.control": "none", "length.max_tokens": 12, "train.steps": 2, "train.save_every": 2,
        "eval.prompts": 2, "eval.every": 2, "data.reward": {"exact_match": 1.0, "format": 0.5}}
r = load_recipe("scalerl", {**tiny, "algorithm.loss": "grpo", "algorithm.grpo_epsilon": [0.1, 0.3]})
said["trl"] = {k: trl_args(r)[k] for k in ("loss_type", "importance_sampling_level", "epsilon", "epsilon_high")}
said["plan"] = [line.strip() for line in format_plan(r).splitlines() if line.strip().startswith("loss ")]
train(r, sys.argv[2], log=lambda m: None)
print(json.dumps(said))
"""


def _documented_loss(tmp_path: Path) -> Path:
    """docs/extending.md's loss module, as the page writes it, in a folder of the losses package."""
    return documented_module(tmp_path, "## Adding a loss", "more-losses", "grpo.py")


@pytest.mark.slow
def test_the_documented_loss_trains(tiny_base, tmp_path):
    """The page's module, dropped into the losses folder and nothing else changed (in a process of
    its own, as ``runners`` loads the folder at import): the recipe takes ``algorithm.loss: grpo`` and
    checks its setting, TRL gets its arguments, the plan prints them, and a real tiny run trains
    with TRL's ``grpo`` loss."""
    import torch

    run_dir = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-c", PROBE, str(_documented_loss(tmp_path)), str(run_dir)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    said = json.loads(res.stdout.strip().splitlines()[-1])
    assert said["losses"] == ["cispo", "dapo", "gspo", "sapo", "grpo"]
    assert said["refused"] == (
        "algorithm.grpo_epsilon = [0.0, 0.2]: need 0 < low < 1 and high > 0 (DeepSeekMath: 0.2, 0.2)"
    )
    trl = {"loss_type": "grpo", "importance_sampling_level": "token", "epsilon": 0.1, "epsilon_high": 0.3}
    assert said["trl"] == trl
    assert said["plan"] == [
        "loss grpo → loss_type='grpo', importance_sampling_level='token', epsilon=0.1, epsilon_high=0.3 "
        "(sequence mean normaliser)"
    ]
    args = torch.load(run_dir / "checkpoints" / "checkpoint-2" / "training_args.bin", weights_only=False)
    assert (args.loss_type, args.epsilon, args.epsilon_high) == ("grpo", 0.1, 0.3)

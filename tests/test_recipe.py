"""Recipes load, inherit, override and fail early with messages that name the key and the fix."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runners.recipe import RECIPES_DIR, RecipeError, load_recipe, parse_override, read_yaml
from runners.rl.plan import format_plan


def test_baseline_recipe_is_the_papers_choices():
    r = load_recipe("scalerl")
    a = r.algorithm
    assert (a.loss, a.cispo_epsilon_max, a.fp32_lm_head) == ("cispo", 5.0, True)
    assert (a.aggregation, a.advantage_norm, a.zero_variance_filter) == ("prompt", "batch", True)
    assert (a.sampling, a.off_policy, a.off_policy_k) == ("no_positive_resampling", "pipeline", 8)
    assert r.length.control == "interruption"


def test_every_shipped_recipe_loads():
    names = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    assert "scalerl" in names and "scalerl-gpu" in names
    for name in names:
        load_recipe(name)


def test_inheritance_and_overrides(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text("inherit: scalerl\nname: child\nalgorithm: {loss: dapo}\nbatch: {prompts: 8}\n")
    r = load_recipe(child, {"optim.lr": "1e-4", "train.steps": 7, "eval.every": 7})
    assert (r.name, r.algorithm.loss, r.batch.prompts, r.batch.generations) == ("child", "dapo", 8, 16)
    assert r.algorithm.aggregation == "prompt"  # inherited untouched
    assert r.optim.lr == 1e-4 and r.train.steps == 7
    gpu = load_recipe("scalerl-gpu")
    assert gpu.model.dtype == "bfloat16" and gpu.eval.prompts == 1000
    assert gpu.model.gradient_checkpointing and not load_recipe("scalerl").model.gradient_checkpointing  # GPU memory


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"algorithm.los": "dapo"}, r"unknown key 'algorithm.los'; did you mean 'loss'"),
        ({"algorithm.loss": "ppo"}, r"algorithm.loss = 'ppo' is not allowed; choose one of: cispo, dapo, gspo"),
        ({"algorithm.cispo_epsilon_max": 0}, r"algorithm.cispo_epsilon_max = 0.0: must be > 0 \(paper: 4-8\)$"),
        ({"algorithm.gspo_epsilon": [0, 4e-3]}, r"algorithm.gspo_epsilon = \[0.0, 0.004\]: need 0 < low < 1 and high"),
        ({"optim.lr": "fast"}, r"optim.lr = 'fast': expected a number"),
        ({"batch.prompts": 2.5}, r"batch.prompts = 2.5: expected an integer"),
        ({"algorithm.fp32_lm_head": "yes"}, r"expected true or false"),
        ({"batch.micro_batch": 48}, r"batch.micro_batch = 48 does not divide the mini-batch of 256.*such as 32"),
        ({"algorithm.off_policy": "ppo", "algorithm.off_policy_k": 3}, r"off_policy_k = 3 does not divide"),
        ({"batch.generations": 1}, r"needs >= 2 completions per prompt"),
        ({"length.control": "penalty", "length.penalty_cache": 64}, r"penalty_cache = 64: must be in \(0"),
        ({"model.path": "/x"}, r"set exactly one of model.size"),
        ({"model.size": "huge"}, r"model.size = 'huge': choose one of tiny, small, medium"),
        ({"data.reward": {"bleu": 1.0}}, r"data.reward.bleu: unknown reward"),
        ({"eval.prompts": 500}, r"eval.prompts = 500 exceeds data.task.n_val = 200"),
        ({"length.think_budget": [40, 24]}, r"length.think_budget = \[40, 24\]"),
        ({"data.task.max_operands": "four"}, r"data.task.max_operands = 'four': expected an integer"),
        ({"data.train_prompts": 8}, r"data.train_prompts = 8: must be at least batch.prompts = 16"),
        ({"data.train_prompts": 30000}, r"data.train_prompts = 30000: the embedded task has only data.task.n_train"),
        # numpy refuses these seeds only once each run has started (issue 42, item 8)
        ({"train.seed": -1}, r"train.seed = -1: must be in \[0, 4294967295\]"),
        ({"train.seed": 2**32}, r"train.seed = 4294967296: must be in \[0, 4294967295\]"),
        ({"train.mismatch_every": 0}, r"train.mismatch_every = 0: must be >= 1 \(1: every step\)$"),
        # a tuple's example is its default, not its types (issue 42, item 10)
        ({"length.think_budget": "[1"}, r"length.think_budget = '\[1': expected a list of 2 numbers, e.g. \[24, 40\]$"),
        ({"algorithm.dapo_epsilon": 0.2}, r"dapo_epsilon = 0.2: expected a list of 2 numbers, e.g. \[0.2, 0.28\]$"),
        # a name is one path segment (issue 42, item 11)
        ({"name": "../../x"}, r"name = '../../x': a recipe's name must be one path segment: letters, digits"),
        ({"name": ".hidden"}, r"name = '.hidden': a recipe's name must be one path segment"),
        ({"name": "a/b"}, r"name = 'a/b': a recipe's name must be one path segment"),
        ({"name": "loo/../../x=1"}, r"name = 'loo/../../x=1': a recipe's name must be one path segment"),
        ({"name": "my recipe"}, r"name = 'my recipe': a recipe's name must be one path segment"),
        # issue 60: a budget with no evaluation inside it, and a name too long for its folder
        (
            {"train.steps": 4},
            r"^eval.every = 25 is more than train.steps = 4: the run would be evaluated at step 0 and its end only, "
            r"never every 25 steps; set eval.every to at most 4 \(e.g. 1\), or raise train.steps$",
        ),
        ({"name": "r" * 101}, r"name = 'r{101}': a recipe's name is 101 characters long; .* to 100 characters or"),
    ],
)
def test_bad_recipes_fail_with_the_key_and_fix(overrides, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe("scalerl", overrides)


def test_a_recipe_is_named_as_a_campaign_names_its_runs_or_by_one_segment():
    """The names a campaign gives its runs' recipes (CAMPAIGN/VARIANT) load; so does any one segment."""
    for name in ("my-recipe_2.1", "loo-cpu/baseline", "loo-cpu/loss=dapo", "c/control=lr_half", "c/data=/d/x.jsonl"):
        assert load_recipe("scalerl", {"name": name}).name == name


def test_a_bad_set_value_is_one_line_from_the_shell():
    """`--set length.think_budget=[1` (an unclosed list) and `--set train.seed=-1`: exit code 2, one line
    with a real example, before anything runs."""
    for value, line in (
        ("length.think_budget=[1", "error: length.think_budget = '[1': expected a list of 2 numbers, e.g. [24, 40]"),
        ("train.seed=-1", "error: train.seed = -1: must be in [0, 4294967295] (numpy's range), e.g. 0"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "runners", "plan", "scalerl", "--set", value], capture_output=True, text=True
        )
        assert r.returncode == 2 and r.stderr.splitlines() == [line], r.stderr


def test_train_prompts_limits_the_rl_pool_but_not_the_base_model():
    from runners.task.data import load_rows
    from runners.task.sizes import build_key
    from runners.task.tokenizer import build_tokenizer

    full, small = load_recipe("scalerl"), load_recipe("scalerl", {"data.train_prompts": 100})
    tok = build_tokenizer()
    train_full, val_full = load_rows(full.data, tok, eval_prompts=full.eval.prompts, seed=full.train.seed)
    train_small, val_small = load_rows(small.data, tok, eval_prompts=small.eval.prompts, seed=small.train.seed)
    assert len(train_small) == 100 and train_small == train_full[:100]  # the first 100, ids kept
    assert val_small == val_full
    assert build_key("small", small.data.task) == build_key("small", full.data.task)  # same base model


def test_recipes_and_the_plan_load_without_torch():
    """Loading a campaign validates its recipes (``analysis fit`` does, and never trains): the recipe,
    its loss table, reward names and the plan import no torch, transformers or TRL."""
    probe = (
        "import sys, runners.recipe, runners.rl.plan; "
        "print([m for m in ('torch', 'transformers', 'trl') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_missing_recipe_lists_known_ones():
    with pytest.raises(RecipeError, match="known recipes: .*scalerl"):
        load_recipe("nope")


def test_a_key_given_twice_in_a_recipe_file_is_refused_naming_its_lines(tmp_path):
    """Issue 60, item 10: YAML keeps the last of two equal keys silently, so the second ``lr:`` of a
    section replaced the first with no word. Each file the project reads (recipes, and the files they
    inherit from, as campaign files) is read with one loader that refuses it, naming the file and lines;
    a merge (``<<``) still overrides what it merges."""
    parent = tmp_path / "parent.yaml"
    parent.write_text("inherit: scalerl\noptim:\n  lr: 1.0e-4\n  warmup_steps: 2\n  lr: 3.0e-4\n")
    child = tmp_path / "child.yaml"
    child.write_text("inherit: parent.yaml\nname: child\n")
    line = (
        f"{parent}:5: the key 'lr' is given twice (first on line 3), and YAML would keep only the last one "
        "silently: remove one of them"
    )
    with pytest.raises(RecipeError) as refused:
        load_recipe(child)
    assert str(refused.value) == line
    r = subprocess.run([sys.executable, "-m", "runners", "plan", str(child)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.splitlines() == [f"error: {line}"], r.stderr
    merged = tmp_path / "merged.yaml"
    merged.write_text("inherit: scalerl\nbase: &b {lr: 1.0e-4, warmup_steps: 2}\noptim:\n  <<: *b\n  lr: 3.0e-4\n")
    raw = read_yaml(merged)
    assert raw["optim"] == {"lr": 3.0e-4, "warmup_steps": 2}


def test_inheritance_cycle_is_reported(tmp_path):
    (tmp_path / "a.yaml").write_text("inherit: b.yaml\n")
    (tmp_path / "b.yaml").write_text("inherit: a.yaml\n")
    with pytest.raises(RecipeError, match="inheritance cycle"):
        load_recipe(tmp_path / "a.yaml")


def test_parse_override_reads_yaml_values():
    assert parse_override("algorithm.zero_variance_filter=false") == ("algorithm.zero_variance_filter", False)
    assert parse_override("length.think_budget=[8, 16]") == ("length.think_budget", [8, 16])
    with pytest.raises(RecipeError, match="KEY=VALUE"):
        parse_override("algorithm.loss")


def test_plan_speaks_the_seeds_words():
    text = format_plan(load_recipe("scalerl", {"algorithm.off_policy": "ppo", "batch.micro_batch": 32}))
    assert "rollouts per step (prompts x generations)" in text and "16 x 16 = 256" in text
    assert "optimizer updates per step" in text and "256 / 32 x 1 = 8" in text
    assert "gradient_accumulation_steps = 1" in text and "sets GPU memory" in text
    assert "ppo-8" in text


def test_plan_cli_reports_errors_without_traceback(cli):
    ok = cli("runners", "plan", "scalerl")
    assert ok.returncode == 0 and "Batch plan" in ok.stdout
    bad = subprocess.run(  # from the shell: the real process's exit code and stderr
        [sys.executable, "-m", "runners", "plan", "scalerl", "--set", "batch.micro_batch=48"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "does not divide" in bad.stderr and "Traceback" not in bad.stderr


def test_plan_of_a_campaign_is_its_baseline_run_as_the_campaign_runs_it(cli):
    """`make plan CAMPAIGN=loo-cpu`: the recipe with the campaign's overrides (groups of 8 completions,
    not the recipe's 16), and a --set on top."""

    def plan(*args: str) -> subprocess.CompletedProcess:
        return cli("runners", "plan", *args)

    res = plan("--campaign", "loo-cpu")
    assert res.returncode == 0, res.stderr
    assert "campaign loo-cpu" in res.stdout and "Batch plan for recipe 'loo-cpu/baseline'" in res.stdout
    assert "16 x 8 = 128" in res.stdout and "16 x 16" not in res.stdout
    assert "16 x 4 = 64" in plan("--campaign", "loo-cpu", "--set", "batch.generations=4").stdout
    both = plan("scalerl", "--campaign", "loo-cpu")
    assert both.returncode == 2 and "not both" in both.stderr
    unknown = plan("--campaign", "nosuch")
    assert unknown.returncode == 2 and "campaign 'nosuch' not found (known campaigns:" in unknown.stderr


def test_memory_estimate_names_the_dominant_setting_and_refuses_what_cannot_fit():
    from runners.rl.memory import check_fits, dominant, estimate

    small = load_recipe("scalerl-gpu", {"eval.batch_prompts": 10})
    big = load_recipe("scalerl-gpu", {"eval.batch_prompts": 1000})
    assert dominant(estimate(big)).startswith("evaluation KV cache")
    assert estimate(big)["peak"] > estimate(small)["peak"]
    assert dominant(
        estimate(load_recipe("scalerl-gpu", {"eval.batch_prompts": 10, "batch.micro_batch": 512}))
    ).startswith("training activations")
    with pytest.raises(RecipeError, match=r"needs about .* GiB.*lower eval.batch_prompts"):
        check_fits(big, total_gib=8.0, free_gib=8.0)
    warnings = []
    check_fits(small, total_gib=80.0, free_gib=0.1, log=warnings.append)
    assert warnings and "may need" in warnings[0]

"""Each design axis against a hand-computed reference on small tensors, through the real trainer."""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig

from runners.losses import LOSSES
from runners.recipe import RecipeError, recipe_from_dict
from runners.rl.plan import trl_args
from runners.rl.sampling import NoPositiveResamplingSampler
from runners.rl.train import reward_setup
from runners.rl.trainer import ScaleRLTrainer, aggregation_weights, find_subsequence, zero_variance_groups
from runners.task.basemodel import load_model_and_tokenizer

G = 4  # generations per prompt in these tests


def make_recipe(**sections):
    base = {
        "name": "axis-test",
        "model": {"size": "tiny"},
        "batch": {"prompts": 2, "generations": G, "micro_batch": 8},
        "length": {"control": "none", "max_tokens": 12},
        "train": {"steps": 1},
        "eval": {"prompts": 2, "every": 1},
    }
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v}
    return recipe_from_dict(base)


class ScriptedReward:
    """Returns preset rewards in order, so advantages can be computed by hand."""

    __name__ = "scripted"

    def __init__(self, values):
        self.values = list(values)

    def __call__(self, prompts, completions, **kw):
        out, self.values = self.values[: len(completions)], self.values[len(completions) :]
        return out


def make_trainer(model_dir, recipe, tmp_path, reward_funcs=None, dtype=torch.float32):
    model, tok = load_model_and_tokenizer(model_dir, torch_dtype=dtype)
    rows = [{"prompt": f"Q: {i}+1\n", "answer": str(i + 1), "prompt_id": i} for i in range(8)]
    funcs, weights = reward_setup(recipe)
    if reward_funcs is not None:
        funcs, weights = reward_funcs, [1.0] * len(reward_funcs)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        **trl_args(recipe),
        report_to="none",
        use_cpu=True,
        reward_weights=weights,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    return ScaleRLTrainer(
        model=model,
        args=args,
        reward_funcs=funcs,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        recipe=recipe,
    )


def scored_batch(trainer, rewards):
    """Generate for 2 prompts x G completions with scripted rewards; returns TRL's output dict."""
    trainer.reward_funcs[0].values = list(rewards)
    inputs = [{"prompt": f"Q: {p}+1\n", "answer": str(p + 1), "prompt_id": p} for p in (0, 1) for _ in range(G)]
    trainer.model.train()
    return trainer._generate_and_score_completions(inputs)


# --- advantage normalisation ------------------------------------------------------

REWARDS = [1.0, -1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 1.0]


def expected_advantages(rewards, norm):
    r = torch.tensor(rewards)
    g = r.view(-1, G)
    centred = (g - g.mean(1, keepdim=True)).view(-1)
    if norm == "batch":
        return centred / (r.std() + 1e-4)
    if norm == "prompt":
        return centred / (g.std(1).repeat_interleave(G) + 1e-4)
    return centred


@pytest.mark.parametrize("norm", ["batch", "prompt", "none"])
def test_advantage_normalisation(random_model_dir, tmp_path, norm):
    recipe = make_recipe(algorithm={"advantage_norm": norm, "aggregation": "token", "zero_variance_filter": False})
    trainer = make_trainer(random_model_dir, recipe, tmp_path, reward_funcs=[ScriptedReward([])])
    out = scored_batch(trainer, REWARDS)
    torch.testing.assert_close(out["advantages"], expected_advantages(REWARDS, norm), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("norm", ["none", "batch", "prompt"])
def test_leave_one_out_baseline_is_rloos(random_model_dir, tmp_path, norm):
    """RLOO: each completion against the mean of its G-1 siblings (TRL RLOOTrainer's baseline;
    with batch normalisation, divided by the batch's std as its normalize_advantages does)."""
    recipe = make_recipe(
        algorithm={
            "advantage_baseline": "leave_one_out",
            "advantage_norm": norm,
            "aggregation": "token",
            "zero_variance_filter": False,
        }
    )
    trainer = make_trainer(random_model_dir, recipe, tmp_path, reward_funcs=[ScriptedReward([])])
    out = scored_batch(trainer, REWARDS)
    g = torch.tensor(REWARDS).view(-1, G)
    loo = (g - (g.sum(1, keepdim=True) - g) / (G - 1)).view(-1)  # r_i - mean of the others, by hand
    if norm == "batch":
        want = loo / (loo.std() + 1e-4)
    elif norm == "prompt":
        want = loo / (g.std(1).repeat_interleave(G) + 1e-4)
    else:
        want = loo
    torch.testing.assert_close(out["advantages"], want, rtol=1e-3, atol=1e-3)
    assert trainer._metrics["train"]["advantages/abs_mean"][-1] == pytest.approx(want.abs().mean().item(), rel=1e-3)


# --- zero-variance filtering ----------------------------------------------------------


def test_zero_variance_groups_by_hand():
    r = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, -1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0])
    assert zero_variance_groups(r, G).tolist() == [True, False, True]


@pytest.mark.parametrize("on", [True, False])
def test_zero_variance_filter_removes_prompt_from_loss(random_model_dir, tmp_path, on):
    rewards = [1.0, 1.0, 1.0, 1.0, 1.0, -1.0, 1.0, -1.0]  # prompt 0 has no variance
    recipe = make_recipe(algorithm={"zero_variance_filter": on, "aggregation": "token"})
    trainer = make_trainer(random_model_dir, recipe, tmp_path, reward_funcs=[ScriptedReward([])])
    out = scored_batch(trainer, rewards)
    kept_tokens = out["completion_mask"][:G].sum().item()
    assert (kept_tokens == 0) is on
    assert out["num_items_in_batch"].item() == out["completion_mask"].sum().item()
    assert trainer._metrics["train"]["filter/zero_variance_frac"][-1] == 0.5


# --- loss aggregation -----------------------------------------------------------------


def test_aggregation_weights_reproduce_hand_averages():
    torch.manual_seed(0)
    lengths = torch.tensor([3, 1, 2, 2, 4, 1, 1, 2])
    keep = torch.ones(8, dtype=torch.bool)
    per_token = [torch.randn(int(n)) for n in lengths]
    n_tokens = lengths.sum()

    def aggregated(mode):
        w = aggregation_weights(lengths, keep, G, mode)
        return sum(w[i] * per_token[i].sum() for i in range(8)) / n_tokens

    token = torch.cat(per_token).mean()
    sample = torch.stack([t.mean() for t in per_token]).mean()
    prompt = torch.stack([torch.cat(per_token[:4]).mean(), torch.cat(per_token[4:]).mean()]).mean()
    torch.testing.assert_close(aggregated("token"), token)
    torch.testing.assert_close(aggregated("sample"), sample)
    torch.testing.assert_close(aggregated("prompt"), prompt)


def test_aggregation_weights_ignore_dropped_prompts():
    lengths = torch.tensor([2, 2, 2, 2, 1, 3, 1, 3])
    keep = torch.tensor([False] * 4 + [True] * 4)
    w = aggregation_weights(lengths * keep, keep, G, "prompt")
    assert w[:4].sum() == 0
    torch.testing.assert_close(w[4:], torch.full((4,), 1.0))  # one prompt kept: weights = N / L_group = 1


def test_aggregation_weights_for_a_per_sequence_normaliser_reproduce_hand_averages():
    """SAPO's normaliser (TRL's ``sapo``): each completion's token sum over its own length, then the
    mean over every completion of the batch, dropped ones included (TRL's mean counts each row)."""
    torch.manual_seed(0)
    lengths = torch.tensor([3, 1, 2, 2, 4, 1, 1, 2, 2, 2, 2, 2])
    keep = torch.tensor([True] * 8 + [False] * 4)  # the third prompt left the loss: its mask is zero
    lengths = lengths * keep
    per_token = [torch.randn(int(n)) for n in lengths]

    def aggregated(mode):
        w = aggregation_weights(lengths, keep, G, mode, "sequence_mean")
        return sum(w[i] * per_token[i].sum() / max(int(lengths[i]), 1) for i in range(12)) / 12

    token = torch.cat(per_token).mean()
    sample = torch.stack([t.mean() for t in per_token[:8]]).mean()
    prompt = torch.stack([torch.cat(per_token[:4]).mean(), torch.cat(per_token[4:8]).mean()]).mean()
    torch.testing.assert_close(aggregated("token"), token)
    torch.testing.assert_close(aggregated("sample"), sample)
    torch.testing.assert_close(aggregated("prompt"), prompt)


# --- loss types ------------------------------------------------------------------------


def _policy_logps(trainer, inputs):
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logits = trainer.model(input_ids=ids, attention_mask=att).logits[:, :-1] / trainer.temperature
    logps = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    return logps[:, -inputs["completion_ids"].shape[1] :]


def _sapo_per_token(recipe, log_ratio, adv):
    """SAPO's per-token loss by hand: -sigmoid(tau (r - 1)) 4/tau A, tau by the advantage's sign."""
    a = recipe.algorithm
    tau = torch.where(adv > 0, a.sapo_temperature_pos, a.sapo_temperature_neg)
    return -torch.sigmoid(tau * (log_ratio.exp() - 1)) * 4 / tau * adv


@pytest.mark.parametrize("loss", ["cispo", "dapo", "gspo", "sapo"])
def test_loss_matches_hand_computation(random_model_dir, tmp_path, loss):
    recipe = make_recipe(algorithm={"loss": loss, "aggregation": "token", "zero_variance_filter": False})
    trainer = make_trainer(random_model_dir, recipe, tmp_path, reward_funcs=[ScriptedReward([])])
    out = scored_batch(trainer, REWARDS)
    mask = out["completion_mask"].float()
    torch.manual_seed(1)
    with torch.no_grad():
        logp = _policy_logps(trainer, out)
    old = logp + 0.3 * torch.randn_like(logp)  # a stale behaviour policy: ratios far from 1
    out = {**out, "old_per_token_logps": old}
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by the train loop
    got = trainer._compute_loss(trainer.model, out).detach()

    adv = out["advantages"].unsqueeze(1)
    log_ratio = logp - old
    a = recipe.algorithm
    if loss == "sapo":  # no clip, and TRL's mean over completions of their token means
        per_token = _sapo_per_token(recipe, log_ratio, adv)
        per_completion = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)
        expected = per_completion.mean() / trainer.current_gradient_accumulation_steps
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
        return
    if loss == "cispo":
        per_token = -torch.clamp(log_ratio.exp(), max=a.cispo_epsilon_max) * adv * logp
    else:
        lo, hi = a.dapo_epsilon if loss == "dapo" else a.gspo_epsilon
        if loss == "gspo":  # sequence-level ratio: geometric mean of token ratios
            log_ratio = ((log_ratio * mask).sum(1) / mask.sum(1)).unsqueeze(1)
        ratio = log_ratio.exp()
        per_token = -torch.min(ratio * adv, torch.clamp(ratio, 1 - lo, 1 + hi) * adv)
    n = mask.sum()
    scale = trainer.current_gradient_accumulation_steps / trainer.args.steps_per_generation
    expected = (per_token * mask).sum() / (n * scale)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", ["prompt", "sample", "token"])
@pytest.mark.parametrize("rewards", [REWARDS, [1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0]], ids=["kept", "one-dropped"])
def test_sapo_aggregation_is_the_wanted_average(tiny_base, tmp_path, mode, rewards):
    """``algorithm.aggregation`` under SAPO, whose TRL normaliser is a mean over completions of their
    token means (not CISPO/DAPO's token sum): the loss TRL computes from the weighted advantages is
    the average the recipe asks for, of SAPO's per-token losses at the unweighted advantages, the
    zero-variance prompt (``one-dropped``) left out. Weights made for a token-sum normaliser give
    another number (the completions are of unequal lengths)."""
    recipe = make_recipe(algorithm={"loss": "sapo", "aggregation": mode})
    trainer = make_trainer(tiny_base, recipe, tmp_path, reward_funcs=[ScriptedReward([])])  # it ends its answers
    torch.manual_seed(0)
    out = scored_batch(trainer, rewards)
    mask = out["completion_mask"].float()
    lengths = mask.sum(1)
    assert len(set(lengths[lengths > 0].tolist())) > 1  # unequal lengths: the normalisers differ
    with torch.no_grad():
        logp = _policy_logps(trainer, out)
    old = logp + 0.3 * torch.randn_like(logp)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    got = trainer._compute_loss(trainer.model, {**out, "old_per_token_logps": old}).detach()
    got = got * trainer.current_gradient_accumulation_steps

    adv = expected_advantages(rewards, "batch").unsqueeze(1)  # before any weight
    per_token = _sapo_per_token(recipe, logp - old, adv) * mask
    kept = lengths > 0
    assert kept.sum() == (8 if rewards == REWARDS else 4)
    if mode == "token":
        want = per_token.sum() / mask.sum()
    elif mode == "sample":
        want = (per_token.sum(1)[kept] / lengths[kept]).mean()
    else:
        groups = [slice(0, G), slice(G, 2 * G)]
        want = torch.stack([per_token[g].sum() / mask[g].sum() for g in groups if mask[g].sum() > 0]).mean()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_sapo_trains_the_embedded_model(tiny_base, tmp_path):
    """``algorithm.loss: sapo`` end to end on the embedded tiny model: TRL runs its ``sapo`` loss
    with the recipe's temperatures, the weights move, and they end elsewhere than CISPO's from the
    same seed and batches."""
    from safetensors.torch import load_file

    from runners.rl.train import train

    weights = {}
    for loss in ("sapo", "cispo"):
        r = make_recipe(
            algorithm={"loss": loss, "sapo_temperature_neg": 2.0},
            data={"reward": {"exact_match": 1.0, "format": 0.5}},  # rewards that vary, so every step trains
            train={"steps": 2, "save_every": 2},
        )
        train(r, tmp_path / loss, log=lambda m: None)
        checkpoint = tmp_path / loss / "checkpoints" / "checkpoint-2"
        weights[loss] = load_file(checkpoint / "model.safetensors")
        args = torch.load(checkpoint / "training_args.bin", weights_only=False)
        assert (args.loss_type, args.sapo_temperature_pos, args.sapo_temperature_neg) == (
            ("sapo", 1.0, 2.0) if loss == "sapo" else ("cispo", 1.0, 1.05)
        )
    base = load_file(tiny_base / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights["sapo"].values())
    assert any(not torch.equal(weights["sapo"][k], base[k]) for k in base)  # it trained
    assert any(not torch.equal(weights["sapo"][k], weights["cispo"][k]) for k in base)  # as SAPO, not CISPO


# --- FP32 LM head -----------------------------------------------------------------------


@pytest.mark.parametrize("on", [True, False])
def test_fp32_lm_head(random_model_dir, tmp_path, on):
    recipe = make_recipe(model={"dtype": "bfloat16"}, algorithm={"fp32_lm_head": on})
    trainer = make_trainer(random_model_dir, recipe, tmp_path, dtype=torch.bfloat16)
    assert trainer.model.lm_head.weight.dtype == (torch.float32 if on else torch.bfloat16)
    assert trainer.model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    # the head computes in fp32 where training computes: under bf16 autocast (TRL's cast alone
    # left the matmul to autocast, so its logits were bf16 and the axis did nothing)
    ids = torch.tensor([trainer.processing_class("Q: 1+2\n")["input_ids"]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = trainer.model(input_ids=ids).logits
    assert logits.dtype == (torch.float32 if on else torch.bfloat16)


def mismatch_of(trainer) -> float:
    trainer.state.global_step = 0
    scored_batch(trainer, REWARDS)
    return trainer._metrics["train"]["sampling/sampling_logp_difference/mean"][-1]


def test_generator_logps_are_the_trainers_in_full_precision(random_model_dir, tmp_path):
    """The probe pairs each sampled token with the logits it was drawn from: in fp32 with no
    autocast, generator and trainer compute the same numbers, so any misalignment would show."""
    trainer = make_trainer(random_model_dir, make_recipe(), tmp_path, reward_funcs=[ScriptedReward([])])
    torch.manual_seed(0)
    out = scored_batch(trainer, REWARDS)
    mask = out["completion_mask"].bool()
    assert mask.sum() > 8 and not torch.isnan(out["sampling_per_token_logps"][mask]).any()
    want = _policy_logps(trainer, out)
    torch.testing.assert_close(out["sampling_per_token_logps"][mask], want[mask], rtol=1e-4, atol=1e-4)
    assert trainer._metrics["train"]["sampling/sampling_logp_difference/mean"][-1] < 1e-4


def test_interrupted_completions_have_no_generator_logp_for_the_phrase(random_model_dir, tmp_path):
    recipe = make_recipe(length={"control": "interruption", "think_budget": [3, 5], "answer_budget": 3})
    trainer = make_trainer(random_model_dir, recipe, tmp_path)
    tok = trainer.processing_class
    trainer.model.train()
    completions, logps = trainer._generate_single_turn([tok("Q: 1+1\n")["input_ids"]] * 8, None, {}, 8)
    phrase = trainer._phrase_ids
    interrupted = 0
    for c, lp in zip(completions, logps, strict=True):
        assert len(lp) == len(c)
        start = find_subsequence(c, phrase)
        if start is not None:  # forced tokens: NaN; sampled ones before and after: real log-probs
            interrupted += 1
            assert all(math.isnan(x) for x in lp[start : start + len(phrase)])
            assert all(x <= 0 for x in lp[:start] + lp[start + len(phrase) :])
    assert interrupted >= 4, f"only {interrupted} of 8 completions were interrupted: the test checked too little"


@pytest.mark.parametrize("seed", [0, 1])
def test_fp32_lm_head_shrinks_the_generator_trainer_mismatch(tiny_base, tmp_path, seed):
    """The paper's reason for the FP32 head, measured as runs train (fp32 master weights; generation
    in fp32, the trainer's forward under bf16 autocast): generator and trainer disagree on the
    log-probs of the same tokens, and computing the head in fp32 shrinks that disagreement
    (measured 0.0026 -> 0.0016 and 0.0026 -> 0.0012 on the tiny base model)."""
    got = {}
    for on in (False, True):
        recipe = make_recipe(model={"dtype": "bfloat16"}, algorithm={"fp32_lm_head": on})
        trainer = make_trainer(tiny_base, recipe, tmp_path, [ScriptedReward([])])  # fp32 master weights
        torch.manual_seed(seed)
        got[on] = mismatch_of(trainer)
    assert got[False] > 1e-3
    assert got[True] < 0.8 * got[False]


# --- length control -------------------------------------------------------------------


def test_length_penalty_is_dapo_soft_overlong():
    recipe = make_recipe(length={"control": "penalty", "max_tokens": 20, "penalty_cache": 8})
    funcs, weights = reward_setup(recipe)
    assert len(funcs) == 2 and weights == [1.0, 1.0]
    # L_max 20, L_cache 8: 0 up to 12 tokens, linear to -1 at 20
    got = funcs[1](completion_ids=[[1] * 10, [1] * 16, [1] * 20, [1] * 25])
    assert got == pytest.approx([0.0, -0.5, -1.0, -1.0])


def test_interruption_inserts_phrase_at_budget(random_model_dir, tmp_path):
    recipe = make_recipe(length={"control": "interruption", "think_budget": [5, 9], "answer_budget": 4})
    trainer = make_trainer(random_model_dir, recipe, tmp_path)
    tok = trainer.processing_class
    prompt_ids = [tok("Q: 1+1\n")["input_ids"]] * 16
    trainer.model.train()
    completions, _ = trainer._generate_single_turn(prompt_ids, None, {}, 16)
    phrase = trainer._phrase_ids
    interrupted = 0
    for c in completions:
        text = tok.decode(c)
        if recipe.length.interruption_phrase in text:
            interrupted += 1
            start = next(i for i in range(len(c)) if c[i : i + len(phrase)] == phrase)
            assert 5 <= start <= 9  # cut at the drawn budget
            assert len(c) - start - len(phrase) <= 4  # answer budget
        assert len(c) <= recipe.max_completion_tokens
    assert interrupted > 0  # an untrained model never closes </think> in 5-9 tokens
    rate = trainer._metrics["train"]["length/interruption_rate"][-1]
    assert rate == pytest.approx(interrupted / 16)
    assert trainer.generation_config.max_new_tokens == recipe.max_completion_tokens


# --- prompt sampling --------------------------------------------------------------------


def test_no_positive_resampling_sampler_never_yields_dropped():
    dropped: set[int] = set()
    s = NoPositiveResamplingSampler(
        data_source=list(range(10)), mini_repeat_count=2, batch_size=2, repeat_count=1, seed=0, dropped=dropped
    )
    it = iter(s)
    first = [next(it) for _ in range(4)]
    dropped.update({0, 1, 2, 3, 4})
    rest = list(it)
    assert len(first) + len(rest) == len(s)
    assert not set(rest) & dropped - set(first[2:])  # at most the already-formed chunk


def test_no_positive_resampling_errors_when_too_few_prompts():
    s = NoPositiveResamplingSampler(
        data_source=list(range(4)), mini_repeat_count=1, batch_size=2, repeat_count=1, seed=0, dropped={0, 1, 2}
    )
    with pytest.raises(RuntimeError, match="only 1 remain"):
        list(s)


def test_npr_drops_prompts_at_threshold(random_model_dir, tmp_path):
    recipe = make_recipe(algorithm={"sampling": "no_positive_resampling", "npr_threshold": 0.75})
    trainer = make_trainer(random_model_dir, recipe, tmp_path, reward_funcs=[ScriptedReward([])])
    scored_batch(trainer, [1.0, 1.0, 1.0, -1.0, 1.0, -1.0, -1.0, 1.0])  # pass rates 0.75 and 0.5
    assert trainer.dropped == {0}
    assert trainer.pass_history[1] == [2, 4]
    assert isinstance(trainer._get_train_sampler(), NoPositiveResamplingSampler)
    uniform = make_trainer(random_model_dir, make_recipe(algorithm={"sampling": "uniform"}), tmp_path)
    assert not isinstance(uniform._get_train_sampler(), NoPositiveResamplingSampler)


# --- off-policy algorithm and batch shape ------------------------------------------------


@pytest.mark.parametrize(
    "algo,k,micro,updates,accum",
    [("pipeline", 8, 8, 1, 1), ("ppo", 2, 4, 2, 1), ("ppo", 2, 2, 2, 2), ("pipeline", 8, 4, 1, 2)],
)
def test_off_policy_and_batch_shape_map_to_trl(algo, k, micro, updates, accum):
    r = make_recipe(algorithm={"off_policy": algo, "off_policy_k": k}, batch={"micro_batch": micro})
    t = trl_args(r)
    assert t["per_device_train_batch_size"] * t["steps_per_generation"] == r.rollouts == 8
    assert t["steps_per_generation"] // t["gradient_accumulation_steps"] == updates
    assert t["gradient_accumulation_steps"] == accum
    assert r.mini_batch == 8 // updates


def test_loss_type_mapping():
    """Each loss's TRL arguments: its loss type, ratio level and its own settings, nothing else's
    (SAPO has no epsilon; the clipped losses leave SAPO's temperatures at TRL's defaults)."""
    expected = {
        "cispo": ("cispo", "token", {"epsilon": 0.2, "epsilon_high": 5.0}),
        "dapo": ("dapo", "token", {"epsilon": 0.2, "epsilon_high": 0.28}),
        "gspo": ("dapo", "sequence", {"epsilon": 3e-3, "epsilon_high": 4e-3}),
        "sapo": ("sapo", "token", {"sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05}),
    }
    assert set(expected) == set(LOSSES)  # a new loss in runners.losses gets its expected TRL arguments here
    own = {"epsilon", "epsilon_high", "sapo_temperature_pos", "sapo_temperature_neg"}
    for loss, (lt, level, args) in expected.items():
        t = trl_args(make_recipe(algorithm={"loss": loss}))
        assert (t["loss_type"], t["importance_sampling_level"]) == (lt, level)
        assert {k: v for k, v in t.items() if k in own} == pytest.approx(args)
    t = trl_args(make_recipe(algorithm={"loss": "sapo", "sapo_temperature_pos": 0.5}))
    assert (t["sapo_temperature_pos"], t["sapo_temperature_neg"]) == (0.5, 1.05)


def test_pipeline_lag_trains_on_the_batch_generated_lag_steps_earlier(random_model_dir, tmp_path):
    recipe = make_recipe(algorithm={"pipeline_lag": 1, "zero_variance_filter": False})
    trainer = make_trainer(random_model_dir, recipe, tmp_path, reward_funcs=[ScriptedReward([])])
    got, at_generation = [], {}
    for step in range(3):
        trainer.state.global_step = step
        got.append(scored_batch(trainer, REWARDS))
        with torch.no_grad():  # the policy that generated this step's batch, then a training update
            at_generation[step] = _policy_logps(trainer, trainer._pipeline[-1][1])
            for p in trainer.model.parameters():
                p.add_(0.05 * torch.randn_like(p))
    # step 0 trains on its own batch, step 1 still on batch 0 (pipeline filling), step 2 on batch 1
    assert got[1] is got[0] and got[2] is not got[1]
    assert [born for born, _ in trainer._pipeline] == [1, 2] and trainer._pipeline[0][1] is got[2]
    assert trainer._metrics["train"]["off_policy/staleness"] == [0.0, 1.0, 1.0]
    with torch.no_grad():  # behaviour log-probs are the generating policy's, not today's weights'
        mask = got[2]["completion_mask"].bool()
        torch.testing.assert_close(got[2]["old_per_token_logps"][mask], at_generation[1][mask], rtol=1e-4, atol=1e-5)
        now = _policy_logps(trainer, got[2])
        assert (got[2]["old_per_token_logps"][mask] - now[mask]).abs().max() > 1e-3


def test_pipeline_lag_is_bounded_by_k():
    with pytest.raises(RecipeError, match="pipeline_lag = 9"):
        make_recipe(algorithm={"pipeline_lag": 9, "off_policy_k": 8})


# The private TRL methods ScaleRLTrainer overrides, with their parameters in the pinned TRL.
TRL_OVERRIDES = {
    "_get_train_sampler": ["self", "dataset"],
    "_generate": ["self", "prompts"],
    "training_step": ["self", "model", "inputs", "num_items_in_batch"],
    "log": ["self", "logs", "start_time"],
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "_generate_and_score_completions": ["self", "inputs"],
    "_prepare_inputs": ["self", "generation_batch"],
    "_generate_single_turn": [
        "self",
        "prompt_ids",
        "images",
        "multimodal_fields",
        "num_generations",
        "has_tool_images",
    ],
}


def test_the_private_trl_methods_overridden_keep_their_signatures():
    import inspect

    import trl
    from trl import GRPOTrainer

    from runners.rl.trainer import ScaleRLTrainer

    overridden = {n for n, v in vars(ScaleRLTrainer).items() if callable(v) and hasattr(GRPOTrainer, n)} - {"__init__"}
    assert overridden == set(TRL_OVERRIDES), "update TRL_OVERRIDES (and the trainer's docstring) with the overrides"
    for name, params in TRL_OVERRIDES.items():
        assert hasattr(GRPOTrainer, name), (
            f"TRL {trl.__version__} has no GRPOTrainer.{name}: ScaleRLTrainer overrides it"
        )
        got = list(inspect.signature(getattr(GRPOTrainer, name)).parameters)
        assert got == params, (
            f"TRL {trl.__version__} changed GRPOTrainer.{name}{tuple(got)} (ScaleRLTrainer was written against "
            f"{tuple(params)}): review runners/rl/trainer.py before upgrading"
        )


# --- generation ------------------------------------------------------------------------


def test_static_kv_cache_samples_the_same_tokens_as_the_dynamic_one(tiny_base, tmp_path):
    """``model.generation_cache: static`` (TRL's ``cache_implementation``; on CUDA transformers then
    compiles the decoding step) is a speed lever only: rollouts, training and evaluation see the
    same tokens as with the dynamic cache, so the same seed gives the same run."""
    import json

    from runners.recipe import load_recipe
    from runners.rl.train import train

    runs = {}
    for cache in ("dynamic", "static"):
        r = load_recipe(
            "scalerl",
            {
                "model.size": "tiny",
                "model.generation_cache": cache,
                "batch.prompts": 2,
                "batch.generations": 4,
                "batch.micro_batch": 8,
                "length.think_budget": [12, 20],
                "train.steps": 2,
                "eval.every": 2,
                "eval.prompts": 8,
            },
        )
        assert trl_args(r)["cache_implementation"] == (None if cache == "dynamic" else "static")
        train(r, tmp_path / cache, log=lambda m: None)
        metrics = [json.loads(x) for x in (tmp_path / cache / "metrics.jsonl").read_text().splitlines()]
        samples = (tmp_path / cache / "samples.jsonl").read_text()
        runs[cache] = ([(m["step"], m["val/mean_at_16"], m["val/format_error_rate"]) for m in metrics], samples)
    assert runs["static"] == runs["dynamic"]
    assert [s for s, _, _ in runs["static"][0]] == [0, 2]


def test_the_cpu_recipes_speed_settings_train_bitwise_the_same_weights(tiny_base, tmp_path, monkeypatch):
    """Two settings trade a diagnostic or memory for speed only, and the CPU recipe takes both (a step
    of the default campaign ~18% and ~11% faster): without ``model.gradient_checkpointing`` TRL never
    enables checkpointing on the model; with ``train.mismatch_every`` above 1 the generator-trainer
    mismatch skips its no-grad forward on the steps between. Either way the run ends with bitwise the
    same weights as with TRL's default and a measure every step, which differ from the base model's."""
    from safetensors.torch import load_file
    from transformers import PreTrainedModel

    from runners.rl.train import train

    enabled: list[bool] = []
    enable = PreTrainedModel.gradient_checkpointing_enable

    def recording_enable(self, *args, **kwargs):  # the real method, its calls counted
        enabled.append(True)
        return enable(self, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "gradient_checkpointing_enable", recording_enable)
    weights = {}
    for checkpointing, every in ((True, 1), (False, 2)):
        enabled.clear()
        r = make_recipe(
            model={"gradient_checkpointing": checkpointing},
            data={"reward": {"exact_match": 1.0, "format": 0.5}},  # rewards that vary, so every step trains
            train={"steps": 2, "save_every": 2, "mismatch_every": every},
        )
        assert trl_args(r)["gradient_checkpointing"] is checkpointing
        train(r, tmp_path / str(every), log=lambda m: None)
        assert bool(enabled) is checkpointing, enabled
        weights[every] = load_file(tmp_path / str(every) / "checkpoints" / "checkpoint-2" / "model.safetensors")
    base = load_file(tiny_base / "model.safetensors")
    assert any(not torch.equal(weights[1][k], base[k]) for k in base)  # it trained
    assert weights[1].keys() == weights[2].keys()
    assert all(torch.equal(weights[1][k], weights[2][k]) for k in weights[1])


def test_the_mismatch_is_measured_every_mismatch_every_steps(tiny_base, tmp_path, monkeypatch):
    """``train.mismatch_every: 3`` pays the mismatch's forward at steps 0, 3, 6 and logs it there alone."""
    trainer = make_trainer(tiny_base, make_recipe(train={"mismatch_every": 3}), tmp_path, [ScriptedReward([])])
    forwards: list[int] = []
    behaviour_logps = trainer._behaviour_logps

    def counted(out):
        forwards.append(trainer.state.global_step)
        return behaviour_logps(out)

    monkeypatch.setattr(trainer, "_behaviour_logps", counted)
    for step in range(7):
        trainer.state.global_step = step
        scored_batch(trainer, REWARDS)
    assert forwards == [0, 3, 6]
    assert len(trainer._metrics["train"]["sampling/sampling_logp_difference/mean"]) == 3


def test_the_static_cache_setting_reaches_generate(tiny_base, tmp_path, monkeypatch):
    """``model.generation_cache: static`` arrives at every ``generate`` of a real run, in both places
    that sample: TRL's rollouts (the trainer's generation config) and evaluation (to which
    runners/rl/train.py passes the trainer's setting). Each call's setting is read as ``generate``
    resolves it: its keyword, else the generation config it is given, else the model's."""
    import sys

    from transformers.generation.utils import GenerationMixin

    from runners.rl.train import train

    seen: list[tuple[str, str | None]] = []  # (the calling module, the cache it generates with)
    generate = GenerationMixin.generate

    def recording_generate(self, *args, **kwargs):  # the real generate, its caller and cache setting recorded
        config = kwargs.get("generation_config") or self.generation_config
        cache = kwargs.get("cache_implementation", getattr(config, "cache_implementation", None))
        seen.append((sys._getframe(1).f_globals["__name__"], cache))
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", recording_generate)
    train(make_recipe(model={"generation_cache": "static"}), tmp_path / "run", log=lambda m: None)
    callers = {caller for caller, _ in seen}
    assert "runners.task.evaluation" in callers and any(c.startswith("trl.") for c in callers), callers
    assert {cache for _, cache in seen} == {"static"}, seen

"""The batch plan (seeds 000 and 003): what a recipe's batch shape means, and TRL's arguments for it
(``trl_args`` for GRPOConfig, ``peft_config`` for the trainer's LoRA adapters: the one recipe→TRL mapping)."""

from __future__ import annotations

from typing import Any

from runners.losses import LOSSES
from runners.recipe import Recipe, RecipeError
from runners.rl.memory import estimate, format_estimate
from runners.rl.sharding import Layout

ADVANTAGE = {"batch": "batch", "prompt": "group", "none": "none"}


def trl_args(r: Recipe, world_size: int = 1) -> dict[str, Any]:
    """GRPOConfig keyword arguments for a recipe on ``world_size`` processes.

    The recipe's batch is global: TRL multiplies per-device sizes by the world size, so each
    process takes 1/world_size of every mini-batch (micro-batch capped accordingly).
    """
    a = r.algorithm
    if r.mini_batch % world_size:
        raise RecipeError(
            f"the mini-batch of {r.mini_batch} completions does not split over {world_size} processes; "
            "choose a device count that divides it (or change batch.prompts / batch.generations)"
        )
    micro = min(r.micro_batch, r.mini_batch // world_size)
    if (r.mini_batch // world_size) % micro:
        raise RecipeError(
            f"batch.micro_batch = {r.micro_batch} does not divide the per-process mini-batch of "
            f"{r.mini_batch // world_size} completions on {world_size} processes; use a divisor of it"
        )
    grad_accum = r.mini_batch // (micro * world_size)
    return {
        **LOSSES[a.loss].trl_args(a),  # loss_type, importance_sampling_level and the loss's own settings
        "cast_lm_head_to_fp32": a.fp32_lm_head,
        "scale_rewards": ADVANTAGE[a.advantage_norm],
        "num_generations": r.batch.generations,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": grad_accum,
        "steps_per_generation": r.rollouts // (micro * world_size),
        "num_iterations": r.batch.epochs,
        "max_completion_length": r.max_completion_tokens,
        "temperature": r.train.temperature,
        "top_p": 1.0,
        "top_k": 0,
        "beta": 0.0,
        "learning_rate": r.optim.lr,
        "adam_epsilon": r.optim.adam_epsilon,
        "weight_decay": r.optim.weight_decay,
        "warmup_steps": r.optim.warmup_steps,
        "max_grad_norm": r.optim.max_grad_norm,
        "lr_scheduler_type": "constant_with_warmup",
        "max_steps": r.train.steps,
        "seed": r.train.seed,
        "bf16": r.model.dtype == "bfloat16",
        "cache_implementation": None if r.model.generation_cache == "dynamic" else r.model.generation_cache,
        "gradient_checkpointing": r.model.gradient_checkpointing,  # the memory estimate reads it too
    }


def plan_lines(r: Recipe, world: int = 1) -> list[tuple[str, str, str]]:
    """(quantity, value, how it is set in TRL) rows of the batch plan, on ``world`` processes."""
    t = trl_args(r, world)
    b = r.batch
    updates = r.updates_per_generation * b.epochs
    micro = t["per_device_train_batch_size"]
    rows = [
        (
            "prompts per step",
            f"{b.prompts}",
            f"generation_batch_size / num_generations = {r.rollouts} / {b.generations}",
        ),
        ("generations per prompt", f"{b.generations}", f"num_generations = {b.generations}"),
        (
            "rollouts per step (prompts x generations)",
            f"{b.prompts} x {b.generations} = {r.rollouts}",
            f"per_device_train_batch_size x steps_per_generation = {micro} x {t['steps_per_generation']}"
            + (f" x {world} processes" if world > 1 else ""),
        ),
        (
            "mini-batch (completions per optimizer update)",
            f"{r.mini_batch}",
            f"per_device_train_batch_size x gradient_accumulation_steps = {micro} x "
            f"{t['gradient_accumulation_steps']}" + (f" x {world} processes" if world > 1 else " (x world size)"),
        ),
        (
            "optimizer updates per step (rollouts / mini-batch x epochs)",
            f"{r.rollouts} / {r.mini_batch} x {b.epochs} = {updates}",
            f"steps_per_generation / gradient_accumulation_steps x num_iterations = "
            f"{t['steps_per_generation']} / {t['gradient_accumulation_steps']} x {t['num_iterations']}",
        ),
        (
            "gradient-accumulation steps (mini-batch / micro-batch)",
            f"{r.mini_batch} / {micro}{f' / {world}' if world > 1 else ''} = {t['gradient_accumulation_steps']}",
            f"gradient_accumulation_steps = {t['gradient_accumulation_steps']}",
        ),
        (
            "micro-batch (completions per forward/backward) — sets GPU memory",
            f"{micro} x up to {r.max_completion_tokens} completion tokens" + (" per process" if world > 1 else ""),
            f"per_device_train_batch_size = {micro}, max_completion_length = {t['max_completion_length']}",
        ),
        (
            "off-policy algorithm",
            f"{r.algorithm.off_policy}-{r.algorithm.off_policy_k}"
            + (f", lag {r.algorithm.pipeline_lag}" if r.algorithm.off_policy == "pipeline" else ""),
            "steps_per_generation > gradient_accumulation_steps means PPO-off-policy (stale mini-batches); "
            "pipeline lag L trains each step on the batch generated L steps earlier",
        ),
        ("optimizer steps in the run", f"{r.train.steps}", f"max_steps = {r.train.steps}"),
        (
            "completions generated in the run",
            f"{r.planned_samples}",
            "max_steps / updates per step x rollouts",
        ),
    ]
    if world > 1:
        rows.insert(0, ("processes (one per GPU)", f"{world}", "accelerate launch --num_processes (--gpus)"))
    return rows


def peft_config(r: Recipe):
    """The PEFT ``LoraConfig`` TRL's trainer takes as ``peft_config`` (None: full fine-tuning)."""
    lo = r.model.lora
    if lo is None:
        return None
    from peft import LoraConfig  # noqa: PLC0415 - only LoRA recipes need peft

    return LoraConfig(
        r=lo.r,
        lora_alpha=lo.alpha,
        lora_dropout=lo.dropout,
        target_modules=list(lo.target_modules),
        task_type="CAUSAL_LM",
    )


def format_plan(r: Recipe, layout: Layout | None = None) -> str:
    """The batch plan, TRL's arguments and what each device holds, for ``layout`` (default: one process)."""
    lay = layout or Layout()
    rows = plan_lines(r, lay.world)
    w1 = max(len(q) for q, _, _ in rows)
    w2 = max(len(v) for _, v, _ in rows)
    out = [f"Batch plan for recipe {r.name!r}", ""]
    out += [f"  {q:<{w1}}  {v:<{w2}}  ← {how}" for q, v, how in rows]
    a, t = r.algorithm, trl_args(r)
    loss = LOSSES[a.loss]
    own = "".join(f", {k}={v}" for k, v in loss.trl(**loss.values(a)).items())
    out += [
        "",
        "  Algorithm → TRL:",
        f"    loss {a.loss} → loss_type={t['loss_type']!r}, importance_sampling_level="
        f"{t['importance_sampling_level']!r}{own} ({loss.normaliser.replace('_', ' ')} normaliser)",
        f"    aggregation {a.aggregation} → per-completion advantage weights (runners.rl.trainer)",
        f"    advantage_norm {a.advantage_norm} → scale_rewards={t['scale_rewards']!r}",
        f"    advantage_baseline {a.advantage_baseline}"
        + (
            " → RLOO: TRL's group-centred advantages x G/(G-1), or / their batch std (runners.rl.trainer)"
            if a.advantage_baseline == "leave_one_out"
            else " → TRL's group mean"
        ),
        f"    fp32_lm_head {a.fp32_lm_head} → cast_lm_head_to_fp32={a.fp32_lm_head}"
        + (" (no-op: the model trains in float32)" if r.model.dtype == "float32" and a.fp32_lm_head else ""),
        f"    zero_variance_filter {a.zero_variance_filter}, sampling {a.sampling}"
        + (f" (threshold {a.npr_threshold})" if a.sampling == "no_positive_resampling" else ""),
        f"    length control {r.length.control} → max_completion_length={r.max_completion_tokens}",
        "    model: "
        + (
            "full fine-tuning (every weight trains)"
            if r.model.lora is None
            else f"LoRA r={r.model.lora.r}, alpha={r.model.lora.alpha:g}, dropout={r.model.lora.dropout:g} on "
            f"{', '.join(r.model.lora.target_modules)} → peft_config (only the adapters train)"
            + (", weights in 4-bit NF4 (QLoRA)" if r.model.quantization == "4bit" else "")
        ),
        "",
        f"  Device memory on each GPU, {lay.describe()} (estimate, runners.rl.memory):",
        *format_estimate(estimate(r, layout=lay)),
    ]
    if lay.world > 1:  # the other way to spread the run, for comparison
        other = Layout(lay.world) if lay.shards_state else Layout(lay.world, 2, "FULL_SHARD")
        how = "--accelerate-config experiments/accelerate/fsdp2.yaml" if other.fsdp else "no --accelerate-config"
        out.append(
            f"  With {other.describe()} ({how}) each GPU would hold about {estimate(r, layout=other)['peak']:.2f} GiB."
        )
    return "\n".join(out)

"""Device-memory estimate of a recipe, by component, so a run that cannot fit is refused with a
pointer to the setting that dominates instead of failing with a CUDA out-of-memory traceback.

An upper bound, rough on purpose: it assumes every sequence runs to ``length.max_tokens``.
Measured on an H100 (results/gpu-memory): 1.1-1.3x above the peak where completions run to the
limit (an 823M model; full, LoRA and QLoRA), 3.5x above it where they stop early (``scalerl-gpu``:
28.9 GiB estimated, 7.9-8.2 GiB measured, its evaluation's answers end near 26 of 96 tokens).
Counted: weights, gradients and AdamW state of fp32 master weights; saved activations of one
micro-batch, under gradient checkpointing (``model.gradient_checkpointing``, TRL's GRPO default:
each layer's input, plus one layer's full set as it is recomputed) or without it (every layer's full
set) — the Korthikanti et al. per-layer count, plus eager attention's score matrices; the LM head's
logits; and the KV cache of generation and of evaluation (weights are fp32, so is the cache).
Per device, for a run's ``Layout`` (runners.rl.sharding): each of N processes takes 1/N of the
rollouts, its share of the mini-batch and of the evaluation prompts. DDP keeps the whole state on
every device, plus its gradient buckets (a copy of the gradients); FSDP splits weights, gradients
and AdamW state N ways and gathers units as it goes (the root unit, embeddings and LM head, and
two decoder layers in flight, weights and gradients, fp32 as an upper bound; SHARD_GRAD_OP keeps
every layer's gathered weights from forward to backward).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from runners.recipe import Recipe, RecipeError
from runners.rl.sharding import Layout

GIB = 2**30
PROMPT_TOKENS = 48  # embedded task prompts are <= ~40 characters (= tokens) with the template


@dataclass(frozen=True)
class Dims:
    params: int
    hidden: int
    layers: int
    heads: int
    vocab: int
    intermediate: int = 0


def model_dims(recipe: Recipe) -> Dims:
    if recipe.model.path is not None:
        cfg = json.loads((Path(recipe.model.path) / "config.json").read_text())
        h, n, a, v = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["vocab_size"]
        inter = cfg.get("intermediate_size", 4 * h)
    else:
        from runners.task.sizes import SIZES
        from runners.task.tokenizer import build_tokenizer

        s = SIZES[recipe.model.size]
        h, n, a, inter, v = s.hidden, s.layers, s.heads, s.intermediate, len(build_tokenizer())
    params = n * (4 * h * h + 3 * h * inter) + 2 * v * h
    return Dims(params, h, n, a, v, inter)


def lora_params(recipe: Recipe, d: Dims) -> int:
    """Trainable adapter parameters: r x (in + out) per targeted projection per layer (Llama-style names)."""
    lo = recipe.model.lora
    if lo is None:
        return d.params
    shape = {"gate_proj": d.hidden + d.intermediate, "up_proj": d.hidden + d.intermediate}
    shape["down_proj"] = d.intermediate + d.hidden
    return d.layers * sum(lo.r * shape.get(name, 2 * d.hidden) for name in lo.target_modules)


def estimate(recipe: Recipe, dims: Dims | None = None, layout: Layout | None = None) -> dict[str, float]:
    """GiB per component on each device, and ``peak``: the state kept between steps (and, under
    FSDP, the units gathered at any moment) plus the largest phase."""
    d = dims or model_dims(recipe)
    lay = layout or Layout()
    n = lay.world
    seq = PROMPT_TOKENS + recipe.max_completion_tokens
    act_bytes = 2 if recipe.model.dtype == "bfloat16" else 4
    micro = max(1, min(recipe.micro_batch, recipe.mini_batch // n))  # per process, as plan.trl_args
    rollouts = max(1, recipe.rollouts // n)
    e = recipe.eval
    eval_prompts = min(e.batch_prompts, -(-e.prompts // n))  # one generate call's prompts, busiest process
    attn_scores = 0 if recipe.model.attention == "sdpa" else d.heads * seq * seq * 4  # eager keeps them (fp32)
    per_seq_layer = seq * 17 * d.hidden * act_bytes + attn_scores
    if recipe.model.gradient_checkpointing:  # every layer's input is kept; one layer's activations exist at a time
        per_seq_acts = d.layers * seq * d.hidden * act_bytes + per_seq_layer
    else:
        per_seq_acts = d.layers * per_seq_layer
    kv = 2 * d.layers * d.hidden * seq * 4  # per sequence, fp32 weights → fp32 cache
    trainable = lora_params(recipe, d)
    frozen_bytes = 0.5 if recipe.model.quantization == "4bit" else 4
    state_key = "weights, gradients, AdamW state"
    if recipe.model.lora is not None:
        state_key = f"frozen weights + {trainable:,} trainable adapter parameters with gradients and AdamW state"
    state_bytes = (frozen_bytes * d.params if recipe.model.lora is not None else 0) + 16 * trainable
    held: dict[str, float] = {}  # what is held through every phase besides the state
    if lay.shards_state:
        state_key += f" (1/{n} on each: FSDP {lay.fsdp} {lay.strategy})"
        state_bytes /= n
        layer = (d.params - 2 * d.vocab * d.hidden) / d.layers
        if lay.keeps_gathered_weights:
            key = "gathered parameters (every layer's weights from forward to backward, two layers' gradients)"
            held[key] = (4 * d.params + 2 * 4 * layer) / GIB
        else:
            key = "gathered parameters (root unit and two decoder layers in flight, weights and gradients)"
            held[key] = 8 * (2 * d.vocab * d.hidden + 2 * layer) / GIB
    elif n > 1:
        held[f"DDP gradient buckets (a copy of the gradients on each of {n} devices)"] = 4 * trainable / GIB
    out = {
        state_key: state_bytes / GIB,
        **held,
        f"training activations (micro-batch {micro} x {seq} tokens)": micro * per_seq_acts / GIB,
        f"logits (micro-batch {micro} x {seq} x vocab {d.vocab}, fp32)": 3 * micro * seq * d.vocab * 4 / GIB,
        f"generation KV cache ({rollouts} completions)": rollouts * kv / GIB,
        f"evaluation KV cache ({eval_prompts} prompts x {e.samples} samples)": eval_prompts * e.samples * kv / GIB,
    }
    state = out[state_key] + sum(held.values())
    phases = {k: v for k, v in out.items() if k != state_key and k not in held}
    train_phase = sum(v for k, v in phases.items() if k.startswith(("training", "logits")))
    gen = next(v for k, v in phases.items() if k.startswith("generation"))
    ev = next(v for k, v in phases.items() if k.startswith("evaluation"))
    out["peak"] = state + max(train_phase, gen, ev)
    return out


def dominant(est: dict[str, float]) -> str:
    return max((k for k in est if k != "peak"), key=lambda k: est[k])


SHARD = "--gpus N --accelerate-config experiments/accelerate/fsdp2.yaml (docs/operations.md)"
ADVICE = {
    "weights, gradients, AdamW state (1/": "more GPUs (each holds 1/N: --gpus N), LoRA (model.lora), a smaller model",
    "weights": f"a smaller model (model.size), LoRA (model.lora), or shard it over N GPUs: {SHARD}",
    "frozen": "4-bit frozen weights (model.quantization: 4bit) or a smaller model (model.size)",
    "gathered": "FULL_SHARD (FSDP 1) or fsdp_reshard_after_forward: true (FSDP 2): one layer gathered at a time",
    "DDP": f"shard instead of replicating: {SHARD}",
    "training": "lower batch.micro_batch (same math, more accumulation steps) or length.max_tokens / think_budget",
    "logits": "lower batch.micro_batch (same math, more accumulation steps)",
    "generation": "fewer rollouts per step (batch.prompts x batch.generations) or shorter completions",
    "evaluation": "lower eval.batch_prompts (same result, more batches)",
}


def advice(component: str) -> str:
    return next(v for k, v in ADVICE.items() if component.startswith(k))


def largest_part(est: dict[str, float]) -> str:
    """'<component> (x of y GiB): <what to lower>' for error messages."""
    dom = dominant(est)
    return f"{dom} ({est[dom]:.1f} of {est['peak']:.1f} GiB): {advice(dom)}"


def format_estimate(est: dict[str, float]) -> list[str]:
    dom = dominant(est)
    w = max(72, *(len(k) for k in est))
    lines = [f"    {k:<{w}} {v:8.2f} GiB" for k, v in est.items() if k != "peak"]
    lines.append(f"    {'estimated peak (what is held between steps + largest phase)':<{w}} {est['peak']:8.2f} GiB")
    lines.append(f"  Dominant: {dom}; to shrink it: {advice(dom)}.")
    return lines


def check_fits(recipe: Recipe, total_gib: float, free_gib: float, log=print, layout: Layout | None = None) -> None:
    """Refuse a run whose estimate exceeds the device; warn when it exceeds what is free now."""
    lay = layout or Layout()
    est = estimate(recipe, layout=lay)
    if est["peak"] > total_gib:
        how = f" with {lay.describe()}" if lay.world > 1 else ""
        raise RecipeError(
            f"recipe {recipe.name!r} needs about {est['peak']:.1f} GiB of device memory{how}, each device has "
            f"{total_gib:.1f} GiB; the largest part is {largest_part(est)}"
        )
    if est["peak"] > free_gib:
        log(
            f"warning: recipe {recipe.name!r} may need {est['peak']:.1f} GiB, {free_gib:.1f} GiB is free now "
            f"(other processes hold the rest); largest part: {dominant(est)}"
        )

"""``ScaleRLTrainer``: TRL's ``GRPOTrainer`` plus the ScaleRL design axes TRL lacks.

TRL provides the losses (CISPO, DAPO, GSPO via sequence-level ratios, SAPO), the FP32 LM head,
advantage normalisation (``scale_rewards``), PPO-off-policy-k (``steps_per_generation``)
and the soft overlong punishment. This subclass adds, through TRL's own extension
points and without copying its code:

- loss aggregation ``prompt`` / ``sample`` / ``token``: TRL's normaliser is kept (the
  loss's own, ``runners.losses``: a token sum for ``cispo`` and ``dapo``, a mean of
  per-completion means for ``sapo``) and each completion's advantage is scaled by a
  positive weight so that the sum equals the wanted average. These losses are linear in
  a positive advantage scale (SAPO's temperature follows the advantage's sign), so this is exact;
- zero-variance filtering: prompts whose rewards are all equal leave the loss and its
  normaliser (their completion mask is zeroed); the batch shrinks, no resampling;
- No-Positive-Resampling: pass-rate history per prompt, gathered across processes, feeds
  the sampler in ``runners.rl.sampling``;
- interruptions: generation stops at a thinking budget drawn per completion; if
  ``</think>`` was not written by then, the interruption phrase is appended and the model
  writes its answer within an answer budget;
- PipelineRL lag: on one process generation never overlaps training, so PipelineRL-k would
  be on-policy; ``pipeline_lag`` L trains each step on the batch generated L steps earlier,
  with behaviour log-probs recorded at generation (so the losses' importance ratios and
  clipping act as they do under real asynchrony);
- FP32 LM head under mixed precision: TRL's cast alone is undone by autocast (the head's
  matmul ran in bf16); the head's forward runs outside autocast (``fp32_head_outside_autocast``);
- RLOO's leave-one-out baseline (``algorithm.advantage_baseline``) over TRL's group-centred advantages;
- the generator-vs-trainer log-prob mismatch: a forward hook (``SampledTokenLogps``) reads the
  generator's sampled-token log-probs off ``generate`` and returns them through TRL's ``logprobs``;
- metrics for every axis: filtered fraction, dropped prompts, interruption rate, staleness, mismatch;
- its own resume state (``state_dict`` / ``load_state_dict``), saved with each checkpoint;
- FSDP (``runners.rl.sharding``): the probe hooks the unwrapped model TRL generates with, and an
  interruption's continuation is generated on every process when any process needs one.

Honestly: TRL has no public hooks for these, so this class overrides **private** methods of
the pinned TRL (``requirements.lock``): ``_get_train_sampler``, ``_generate``,
``_calculate_rewards``, ``_generate_and_score_completions``, ``_prepare_inputs`` and
``_generate_single_turn`` (plus the public ``training_step`` and ``log``).
``tests/test_axes.py::test_the_private_trl_methods_overridden_keep_their_signatures`` fails,
naming the method, when an upgrade changes any of them.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from runners.losses import LOSSES, Normaliser
from runners.recipe import Recipe
from runners.rl.profiling import PhaseProfiler
from runners.rl.sampling import NoPositiveResamplingSampler
from runners.rl.sharding import is_sharded


def find_subsequence(seq: list[int], sub: list[int]) -> int | None:
    n = len(sub)
    for i in range(len(seq) - n + 1):
        if seq[i : i + n] == sub:
            return i
    return None


def zero_variance_groups(values: torch.Tensor, group_size: int) -> torch.Tensor:
    """True for each prompt whose ``group_size`` values are all equal: rewards all equal, or, the
    same thing after group centring, advantages all zero (no learning signal)."""
    grouped = values.view(-1, group_size)
    return (grouped.amax(1) - grouped.amin(1)).abs() < 1e-6


def aggregation_weights(
    lengths: torch.Tensor, keep: torch.Tensor, group_size: int, mode: str, normaliser: Normaliser = "token_sum"
) -> torch.Tensor:
    """Per-completion weights on the advantages that turn the loss TRL normalises into the wanted average.

    ``normaliser`` is the loss's (``runners.losses``). With per-token losses l_it, completion lengths
    L_i, N kept tokens, n completions (kept or not: TRL's mean counts every row) and m_i = sum_t l_it / L_i:
    ``token_sum`` (CISPO, DAPO, GSPO): loss = sum_i w_i L_i m_i / N;
    ``sequence_mean`` (SAPO): loss = sum_i w_i m_i / n. The wanted averages:
    ``token``  → mean over all kept tokens, sum_i L_i m_i / N;
    ``sample`` → mean over kept completions of their token mean, sum_i m_i / n_kept;
    ``prompt`` → mean over kept prompts of the token mean of all their completions,
    sum_i L_i m_i / (n_kept_prompts L_group(i)) (ScaleRL's prompt-level average).
    Dropped completions weigh 0.
    """
    lengths = lengths.float()
    total = (lengths * keep).sum()
    if normaliser == "token_sum":  # TRL weighs each completion's token sum 1/N
        numerator = total
    elif normaliser == "sequence_mean":  # TRL weighs each completion's token sum 1/(n L_i)
        numerator = lengths.numel() * lengths
    else:
        raise ValueError(f"unknown normaliser {normaliser!r}")
    if mode == "token":  # the wanted weight on a token sum is 1/N
        weight = torch.ones_like(lengths) if normaliser == "token_sum" else numerator / total.clamp(min=1)
    elif mode == "sample":  # 1/(n_kept L_i)
        weight = numerator / (keep.sum().clamp(min=1) * lengths.clamp(min=1))
    elif mode == "prompt":  # 1/(n_kept_prompts L_group(i))
        group_tokens = (lengths * keep).view(-1, group_size).sum(1).repeat_interleave(group_size)
        n_prompts = keep.view(-1, group_size)[:, 0].sum().clamp(min=1)
        weight = numerator / (n_prompts * group_tokens.clamp(min=1))
    else:
        raise ValueError(f"unknown aggregation {mode!r}")
    return torch.where(keep, weight, torch.zeros_like(weight))


def fp32_head_outside_autocast(model) -> None:
    """Make the FP32 LM head compute in fp32 under mixed precision too.

    TRL's ``cast_lm_head_to_fp32`` keeps the head's weights in fp32 and casts its inputs, but
    under ``torch.autocast`` (bf16 training with fp32 master weights) the matmul is still run
    in bf16, so the logits the loss sees are bf16 and the axis does nothing. Here the head's
    forward runs with autocast disabled: fp32 logits for generation and training alike.
    """
    head = model.lm_head
    inner = head.forward

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            return inner(hidden_states)

    head.forward = forward


NAN = float("nan")


def _jsonable(state):
    return [_jsonable(x) for x in state] if isinstance(state, tuple | list) else state


def _tupled(state):
    return tuple(_tupled(x) for x in state) if isinstance(state, list) else state


class SampledTokenLogps:
    """Reads, off ``model.generate``, the log-prob the generator gave each token it sampled.

    A forward hook on the model: at every decoding step the model's input is the token sampled
    from the previous step's logits, so each call pairs the two (temperature applied, as the
    trainer's log-probs do). The last sampled token has no next step; ``per_completion`` takes
    it from the completions. Holds one ``batch × vocab`` row of logits at a time.
    """

    def __init__(self, model: torch.nn.Module, temperature: float) -> None:
        # generate runs the transformers model inside a PEFT wrapper: hook that one
        self.model = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.temperature = temperature
        self.columns: list[torch.Tensor] = []
        self._last: torch.Tensor | None = None  # log-softmax of the latest step's logits

    def __enter__(self) -> SampledTokenLogps:
        self._handle = self.model.register_forward_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()

    @torch.no_grad()
    def _hook(self, module, args, kwargs, output) -> None:
        ids = kwargs.get("input_ids")
        if self._last is not None and ids is not None:
            self.columns.append(self._last.gather(1, ids[:, -1:]).squeeze(1))
        self._last = torch.log_softmax(output.logits[:, -1].float() / self.temperature, dim=-1)

    def per_completion(self, completions: list[list[int]]) -> list[list[float]]:
        """Each completion's token log-probs under the generator (NaN where none was recorded)."""
        if self._last is None:
            return [[NAN] * len(c) for c in completions]
        cols = torch.stack(self.columns, 1).tolist() if self.columns else [[] for _ in completions]
        out = []
        for i, c in enumerate(completions):
            row = cols[i][: len(c)]
            if len(c) == len(row) + 1:  # the last token, sampled from the final step's logits
                row.append(float(self._last[i, c[-1]]))
            out.append(row + [NAN] * (len(c) - len(row)))
        return out


class ScaleRLTrainer(GRPOTrainer):
    def __init__(self, *args: Any, recipe: Recipe, **kwargs: Any) -> None:
        self.recipe = recipe
        self.pass_history: dict[int, list[int]] = defaultdict(lambda: [0, 0])  # prompt_id → [correct, seen]
        self.dropped: set[int] = set()
        self._rng = random.Random(recipe.train.seed)
        self.compute_tokens = 0  # prompt + completion tokens of every generated completion (filtered or not)
        self.compute_samples = 0  # completions generated
        self._pipeline: deque[tuple[int, dict]] = deque()  # (generation step, scored batch), oldest first
        self.profiler = PhaseProfiler()
        super().__init__(*args, **kwargs)
        if self.args.cast_lm_head_to_fp32:
            fp32_head_outside_autocast(self.model)
        tok = self.processing_class
        ln = recipe.length
        self._phrase_ids = tok(ln.interruption_phrase, add_special_tokens=False)["input_ids"]
        self._think_close_ids = tok("</think>", add_special_tokens=False)["input_ids"]

    # --- state that must survive a resume (saved with each checkpoint by runners.rl.train) ---
    def state_dict(self) -> dict[str, Any]:
        return {
            "compute_tokens": self.compute_tokens,
            "compute_samples": self.compute_samples,
            "pass_history": {str(k): v for k, v in self.pass_history.items()},
            "dropped": sorted(self.dropped),
            "budget_rng": _jsonable(self._rng.getstate()),  # thinking budgets drawn so far: continue the sequence
        }

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.compute_tokens = s["compute_tokens"]
        self.compute_samples = s.get("compute_samples", 0)
        self.pass_history.update({int(k): v for k, v in s["pass_history"].items()})
        self.dropped.update(s["dropped"])
        if "budget_rng" in s:
            self._rng.setstate(_tupled(s["budget_rng"]))

    # --- No-Positive-Resampling ---------------------------------------------------
    def _get_train_sampler(self, dataset=None):
        if self.recipe.algorithm.sampling == "uniform":
            return super()._get_train_sampler(dataset)
        dataset = self.train_dataset if dataset is None else dataset
        return NoPositiveResamplingSampler(
            data_source=dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset,
            seed=self.args.seed,
            dropped=self.dropped,
        )

    # --- time and memory per phase -----------------------------------------------------
    def _generate(self, *args, **kwargs):
        with self.profiler.phase("generation"):
            return super()._generate(*args, **kwargs)

    def training_step(self, model, inputs, num_items_in_batch=None):
        out = super().training_step(model, inputs, num_items_in_batch)  # _prepare_inputs began "update"
        self.profiler.end("update")
        return out

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.model.training:
            for key, value in self.profiler.pop().items():
                self._metrics["train"][key].append(value)
        super().log(logs, start_time)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        with self.profiler.phase("reward"):
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.model.training:
            ids = gather_object([x["prompt_id"] for x in inputs])
            passed = (rewards_per_func[:, 0] > 0).tolist()  # the first reward is the accuracy reward
            for pid, ok in zip(ids, passed, strict=True):
                hist = self.pass_history[pid]
                hist[0] += int(ok)
                hist[1] += 1
            if self.recipe.algorithm.sampling == "no_positive_resampling":
                thr = self.recipe.algorithm.npr_threshold
                self.dropped.update(p for p in set(ids) if self.pass_history[p][0] >= thr * self.pass_history[p][1])
                self._metrics["train"]["npr/dropped_prompts"].append(float(len(self.dropped)))
        return rewards_per_func

    # --- after scoring: compute spent, behaviour log-probs, mismatch, filtering and aggregation ---
    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return out
        algo = self.recipe.algorithm
        self._account_compute(out)
        if algo.off_policy == "pipeline" and algo.pipeline_lag > 0 and out.get("old_per_token_logps") is None:
            out["old_per_token_logps"] = self._behaviour_logps(out)
        self._measure_mismatch(out)
        if algo.advantage_baseline == "leave_one_out":
            self._leave_one_out(out)
        self._filter_and_weight(out)
        return self._pipeline_delay(out) if algo.off_policy == "pipeline" else out

    def _account_compute(self, out: dict) -> None:
        """Count what generation cost, spent whether or not the batch is filtered later."""
        generated = out["prompt_mask"].sum() + out["completion_mask"].sum()
        self.compute_tokens += int(self.accelerator.gather(generated).sum())
        self.compute_samples += out["advantages"].shape[0] * self.accelerator.num_processes

    @torch.no_grad()
    def _measure_mismatch(self, out: dict) -> None:
        """|log-prob under the generator − under the trainer| of the same sampled tokens, same weights.

        The mismatch the FP32 LM head exists to shrink (the generator's and the trainer's kernels
        round differently). Logged under TRL's names for its vLLM case,
        ``sampling/sampling_logp_difference/{mean,max}``. Costs one no-grad forward when the step
        has no behaviour log-probs already (on-policy runs), so those measure it every
        ``train.mismatch_every`` steps; it draws no random numbers, so the cadence leaves training as is.
        """
        sampled = out.get("sampling_per_token_logps")
        if sampled is None:
            return
        trained = out.get("old_per_token_logps")
        if trained is None:
            if self.state.global_step % self.recipe.train.mismatch_every:
                return
            trained = self._behaviour_logps(out)
        delta = (trained.float() - sampled.float()).abs()
        delta = delta[out["completion_mask"].bool() & ~torch.isnan(delta)]
        local = torch.stack(
            [
                delta.sum(),
                torch.tensor(float(delta.numel()), device=delta.device),
                delta.max() if delta.numel() else delta.new_zeros(()),
            ]
        )
        total, count, peak = self.accelerator.gather(local.unsqueeze(0)).view(-1, 3).T
        if count.sum() > 0:
            m = self._metrics["train"]
            m["sampling/sampling_logp_difference/mean"].append(float(total.sum() / count.sum()))
            m["sampling/sampling_logp_difference/max"].append(float(peak.max()))

    def _leave_one_out(self, out: dict) -> None:
        """RLOO's baseline: each completion against the mean of the *other* G-1 of its prompt.

        r_i - mean_{j!=i} r_j = G/(G-1) (r_i - mean_j r_j), so TRL's group-centred advantages are
        rescaled by G/(G-1) (advantage_norm none or prompt). With advantage_norm batch, as TRL's
        RLOOTrainer's ``normalize_advantages``, the batch's advantages are divided by their own std
        (the factor cancels): (r_i - loo_i) / std over the batch.
        """
        g = self.num_generations
        everyone = self.accelerator.gather(out["advantages"])  # one gather: the scale and the metric
        scale = 1.0 / (everyone.std() + 1e-4) if self.recipe.algorithm.advantage_norm == "batch" else g / (g - 1)
        self._metrics["train"]["advantages/abs_mean"].append(float((everyone * scale).abs().mean()))
        out["advantages"] = out["advantages"] * scale

    def _filter_and_weight(self, out: dict) -> None:
        """Zero-variance filtering (mask whole prompts out) and loss aggregation (weights on advantages)."""
        algo, g = self.recipe.algorithm, self.num_generations
        device = out["advantages"].device
        zero_var = zero_variance_groups(self.accelerator.gather(out["advantages"]).to(device), g)
        keep = (~zero_var if algo.zero_variance_filter else torch.ones_like(zero_var)).repeat_interleave(g)
        n_local = out["advantages"].shape[0]
        local = slice(self.accelerator.process_index * n_local, (self.accelerator.process_index + 1) * n_local)
        mask = out["completion_mask"] * keep[local].unsqueeze(1).to(out["completion_mask"].dtype)
        out["completion_mask"] = mask
        lengths = self.accelerator.gather(mask.sum(1))  # every process's completions, in order
        out["num_items_in_batch"] = lengths.sum()
        weight = aggregation_weights(lengths, keep, g, algo.aggregation, LOSSES[algo.loss].normaliser)
        out["advantages"] = out["advantages"] * weight[local].to(out["advantages"].dtype)
        m = self._metrics["train"]
        m["filter/zero_variance_frac"].append(zero_var.float().mean().item())
        m["filter/effective_prompts"].append(float(keep.view(-1, g)[:, 0].sum()))

    # --- PipelineRL lag ---------------------------------------------------------------
    @torch.no_grad()
    def _behaviour_logps(self, out: dict) -> torch.Tensor:
        """Log-probs of the completions under the generating (behaviour) policy, taken at generation time."""
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attention = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        logps, _, _ = self._get_per_token_logps_and_entropies(
            self.model, ids, attention, out["completion_ids"].size(1), batch_size=self.args.per_device_train_batch_size
        )
        return logps

    def _pipeline_delay(self, out: dict) -> dict:
        """Emulate PipelineRL's bounded staleness on one process: train on the batch generated ``lag`` steps ago.

        Generation keeps pace with training, so every step still generates one batch; the trainer consumes the
        oldest of the last ``lag + 1``. While the pipeline fills (the first ``lag`` steps) the first batch is used.
        Behaviour log-probs were recorded at generation, so the loss's importance ratios see the staleness.
        """
        lag = self.recipe.algorithm.pipeline_lag
        step = self.state.global_step
        self._pipeline.append((step, out))
        while len(self._pipeline) > lag + 1:
            self._pipeline.popleft()
        born, batch = self._pipeline[0]
        self._metrics["train"]["off_policy/staleness"].append(float(step - born))
        return batch

    # --- PPO-off-policy-k staleness ----------------------------------------------
    def _prepare_inputs(self, generation_batch):
        out = super()._prepare_inputs(generation_batch)
        if self.model.training:
            ga = self.args.gradient_accumulation_steps
            cycle = self.args.steps_per_generation * self.num_iterations
            if self._step % ga == 0 and self.recipe.algorithm.off_policy == "ppo":
                self._metrics["train"]["off_policy/staleness"].append(float((self._step % cycle) // ga))
            self.profiler.begin("update")  # forward + backward of this micro-batch; ends in training_step
        return out

    # --- generation: interruptions, and the generator's own token log-probs ----------
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """Generate, returning the log-prob the generator gave each sampled token (TRL's ``logprobs`` channel).

        TRL fills ``logprobs`` only for vLLM; here a :class:`SampledTokenLogps` probe reads them off
        ``generate``, so TRL's ``sampling_per_token_logps`` exists on this path too and
        ``_measure_mismatch`` can compare generator and trainer on the same tokens (the FP32 LM head's reason).
        """
        if not self.model.training:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        if self.recipe.length.control == "interruption":
            return self._generate_interrupted(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        return self._sample(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    def _sample(
        self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False, max_new_tokens=None
    ):
        """One call of TRL's generation with the probe attached; ``max_new_tokens`` overrides the length for it."""
        self.generation_config.max_new_tokens = max_new_tokens or self.max_completion_length
        try:
            # the model generate runs (under FSDP 1 the module inside the wrapper, whose forward TRL calls)
            with SampledTokenLogps(self.accelerator.unwrap_model(self.model_wrapped), self.temperature) as probe:
                completions, _ = super()._generate_single_turn(
                    prompt_ids, images, multimodal_fields, num_generations, has_tool_images
                )
        finally:
            self.generation_config.max_new_tokens = self.max_completion_length
        return completions, probe.per_completion(completions)

    def _peers_need(self, n: int) -> bool:
        """Whether any process has work for a collective step (``n`` items here). Under FSDP every
        ``generate`` gathers parameters from all processes, so a call one of them makes, all make;
        otherwise only this process's ``n`` counts."""
        if not is_sharded(self.accelerator):
            return n > 0
        return bool(self.accelerator.gather(torch.tensor([n], device=self.accelerator.device)).max() > 0)

    def _generate_interrupted(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """Interruptions: stop thinking at a budget drawn per completion, append the phrase, let the answer finish."""
        ln = self.recipe.length
        lo, hi = ln.think_budget
        completions, logps = self._sample(prompt_ids, images, multimodal_fields, num_generations, has_tool_images, hi)
        budgets = [self._rng.randint(lo, hi) for _ in completions]
        todo: list[tuple[int, list[int], list[float]]] = []  # (row, prefix to continue, its log-probs)
        interrupted = 0
        for i, (c, budget) in enumerate(zip(completions, budgets, strict=True)):
            ended = bool(c) and c[-1] in self.eos_token_ids
            close = find_subsequence(c, self._think_close_ids)
            if close is not None and close + len(self._think_close_ids) <= budget:
                if not ended:
                    todo.append((i, c, logps[i]))  # thinking closed in time; let the answer finish
            elif not (ended and len(c) <= budget):
                # budget hit: interrupt; the phrase is forced, not sampled, so it has no generator log-prob
                todo.append((i, c[:budget] + self._phrase_ids, logps[i][:budget] + [NAN] * len(self._phrase_ids)))
                interrupted += 1
        if self._peers_need(len(todo)) and not todo:  # FSDP: a peer continues; this process keeps it company
            self._sample(prompt_ids[:1], images, multimodal_fields, num_generations, max_new_tokens=ln.answer_budget)
        if todo:
            tails, tail_logps = self._sample(
                [prompt_ids[i] + prefix for i, prefix, _ in todo],
                images,
                multimodal_fields,
                num_generations,
                max_new_tokens=ln.answer_budget,
            )
            for (i, prefix, prefix_logps), tail, tail_lp in zip(todo, tails, tail_logps, strict=True):
                completions[i], logps[i] = prefix + tail, prefix_logps + tail_lp
        self._metrics["train"]["length/interruption_rate"].append(interrupted / max(1, len(completions)))
        return completions, logps

"""Validation pass rates: mean@k (the paper's mean@16), pass@k and the format-error rate, of any
model that ``generate``s: the base-model build's and, on one or several processes, a run's."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from runners.task.rewards import REWARDS, is_well_formed


@torch.no_grad()
def evaluate(
    model,
    tokenizer,
    rows: Sequence[dict],
    *,
    samples: int = 16,
    max_new_tokens: int = 64,
    batch_prompts: int = 32,
    temperature: float = 1.0,
    reward: str | Callable[..., list[float]] = "exact_match",
    seed: int = 0,
    n_show: int = 8,
    accelerator=None,
    sharded: bool = False,
    cache_implementation: str | None = None,
) -> dict[str, Any]:
    """Sample ``samples`` completions per prompt (batched) and score them.

    With an ``accelerator`` of several processes, each process takes every world-size-th prompt
    and the sums are reduced across processes: every prompt is evaluated exactly once. With
    ``sharded`` (FSDP, ``runners.rl.sharding.is_sharded``; ``model`` from ``full_parameters``)
    every process makes the same number of ``generate`` calls, since each forward gathers
    parameters from all of them: a process out of prompts generates one discarded sequence per
    call its peers still make.

    mean_at_k: average over prompts of the fraction of correct samples.
    pass_at_k: fraction of prompts with at least one correct sample.
    samples: the first completion of the first ``n_show`` prompts, for inspection.
    """
    world = accelerator.num_processes if accelerator is not None else 1
    all_rows, total_rows = rows, len(rows)
    most = -(-total_rows // world)  # prompts of the first process, which has the most
    calls = -(-most // batch_prompts)  # generate calls of the busiest process
    if world > 1:
        rows = rows[accelerator.process_index :: world]
        seed += 7919 * accelerator.process_index  # different samples on each process
    device = next(model.parameters()).device
    score = REWARDS[reward] if isinstance(reward, str) else reward
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens)
    sampling |= dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    tally = _Tally()
    t0 = time.perf_counter()
    with _sampling_state(model, tokenizer, seed):
        for start in range(0, calls * batch_prompts, batch_prompts):
            chunk = rows[start : start + batch_prompts]
            if not chunk and not sharded:
                break
            prompts_text = [_prompt_text(tokenizer, r["prompt"]) for r in chunk or all_rows[:1]]
            enc = tokenizer(prompts_text, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            n = samples if chunk else 1
            out = model.generate(**enc, **sampling, num_return_sequences=n, cache_implementation=cache_implementation)
            if not chunk:  # this process is out of prompts; its peers' gathers needed it in the call
                continue
            texts = tally.count(tokenizer, out[:, enc["input_ids"].shape[1] :], chunk, samples, score)
            tally.show(prompts_text, chunk, texts[::samples], n_show)
    sums = tally.sums(len(rows))
    if world > 1:
        sums = accelerator.reduce(torch.tensor(sums, device=accelerator.device), reduction="sum").tolist()
    assert int(sums[-1]) == total_rows, f"evaluated {sums[-1]} of {total_rows} prompts"
    return _rates(sums, samples, time.perf_counter() - t0, tally.shown)


@contextmanager
def _sampling_state(model, tokenizer, seed: int) -> Iterator[None]:
    """Evaluation mode, left padding and torch's global generator seeded from ``seed`` while sampling;
    all three restored after, so training goes on as it was (its random stream untouched)."""
    was_training = model.training
    model.eval()
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rng_state = torch.random.get_rng_state()
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        yield
    finally:
        tokenizer.padding_side = padding_side
        torch.random.set_rng_state(rng_state)
        model.train(was_training)


@dataclass
class _Tally:
    """One process's counts over the prompts it evaluated."""

    correct_frac: list[float] = field(default_factory=list)  # a prompt's fraction of correct samples
    any_correct: list[float] = field(default_factory=list)  # 1.0 where a prompt has a correct sample
    well_formed: int = 0
    n_tokens: int = 0
    shown: list[dict] = field(default_factory=list)

    def count(self, tokenizer, completion_ids: torch.Tensor, chunk: Sequence[dict], samples: int, score) -> list[str]:
        """Score the ``samples`` completions of each prompt in ``chunk``; their texts."""
        self.n_tokens += int((completion_ids != tokenizer.pad_token_id).sum())
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        answers = [r["answer"] for r in chunk for _ in range(samples)]
        scores = torch.tensor(score([None] * len(texts), texts, answer=answers)).view(len(chunk), samples) > 0
        self.correct_frac += scores.float().mean(1).tolist()
        self.any_correct += scores.any(1).float().tolist()
        self.well_formed += sum(is_well_formed(t) for t in texts)
        return texts

    def show(self, prompts_text: list[str], chunk: Sequence[dict], firsts: list[str], n_show: int) -> None:
        """Keep each prompt's first completion (``firsts``) until ``n_show`` are kept."""
        if len(self.shown) < n_show:
            self.shown += [
                {"prompt": texts_in, "answer": r["answer"], "completion": first}
                for texts_in, r, first in zip(prompts_text, chunk, firsts, strict=True)
            ][: n_show - len(self.shown)]

    def sums(self, n_rows: int) -> list[float]:
        """What the processes add up: correct fractions, prompts passed, well formed, tokens, prompts."""
        counts = [float(self.well_formed), float(self.n_tokens), float(n_rows)]
        return [sum(self.correct_frac), sum(self.any_correct), *counts]


def _rates(sums: list[float], samples: int, seconds: float, shown: list[dict]) -> dict[str, Any]:
    """The evaluation's result from the summed counts of every process."""
    correct, passed, formed, tokens, n_rows = sums
    n = n_rows * samples
    return {
        "mean_at_k": correct / n_rows,
        "pass_at_k": passed / n_rows,
        "format_error_rate": 1.0 - formed / n,
        "completion_tokens": tokens,
        "sequences": n,
        "prompts": int(n_rows),
        "seconds": seconds,
        "samples": shown,
    }


def _prompt_text(tokenizer, prompt) -> str:
    """Plain prompts pass through; conversational ones go through the model's chat template."""
    if isinstance(prompt, list):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return prompt

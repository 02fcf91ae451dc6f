"""Validation pass rates: mean@k (the paper's mean@16), pass@k and the format-error rate, of any
model that ``generate``s: the base-model build's and, on one or several processes, a run's."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from runners.task.rewards import REWARDS, is_well_formed

STRAGGLERS = 0.01  # a batch stops once all but this share of its rows (at least one) have ended; those go on alone


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
            # sharded: every process must make the same generate calls, so no straggler goes on alone
            completions = generate(model, enc, sampling, n, cache_implementation, None if sharded else STRAGGLERS)
            if not chunk:  # this process is out of prompts; its peers' gathers needed it in the call
                continue
            texts = tally.count(tokenizer, completions, chunk, samples, score)
            tally.show(prompts_text, chunk, texts[::samples], n_show)
    sums = tally.sums(len(rows))
    if world > 1:
        sums = accelerator.reduce(torch.tensor(sums, device=accelerator.device), reduction="sum").tolist()
    assert int(sums[-1]) == total_rows, f"evaluated {sums[-1]} of {total_rows} prompts"
    return _rates(sums, samples, time.perf_counter() - t0, tally.shown)


def _unended(completions: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """Which rows of completion ids hold no EOS yet: the one test of a row's end, for the stop and the stragglers."""
    return ~torch.isin(completions, eos).any(1)


class _MostEnded(StoppingCriteria):
    """Stops the whole batch once at most ``share`` of its rows (at least one) have not ended."""

    def __init__(self, start: int, eos: torch.Tensor, share: float):
        self.start, self.eos, self.share = start, eos, share

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        left = int(_unended(input_ids[:, self.start :], self.eos).sum())
        stop = 0 < left <= max(1, int(self.share * len(input_ids)))
        return torch.full((len(input_ids),), stop, dtype=torch.bool, device=input_ids.device)


def generate(model, enc, sampling: dict, n: int, cache_implementation=None, stragglers: float | None = STRAGGLERS):
    """The completions (ids after the prompt, padded) of ``n`` samples of each prompt in ``enc``.

    ``model.generate`` keeps every row of a batch generating until its last row ends: one sample that
    never emits EOS (a model looping on a digit) made an evaluation of 1,024 rows run to
    ``max_new_tokens``, each step dearer than the last as the cache grows (1.5 s became 30-49 s on the
    CPU default). With ``stragglers`` the batch stops once all but that share of its rows have ended,
    and the rows still going continue on their own to the same ``max_new_tokens``: every row ends
    where it would have, the rows that ended first with the very same tokens (the batch draws the
    same random numbers up to the stop), the stragglers with a sampled continuation of their own."""
    start = enc["input_ids"].shape[1]
    eos_id = sampling.get("eos_token_id")
    if eos_id is None:  # nothing ends a row early: there are no stragglers to tell
        stragglers = None
    eos = torch.tensor([] if eos_id is None else eos_id, dtype=torch.long, device=enc["input_ids"].device).view(-1)
    stop = [] if stragglers is None else [_MostEnded(start, eos, stragglers)]
    out = model.generate(
        **enc,
        **sampling,
        num_return_sequences=n,
        cache_implementation=cache_implementation,
        stopping_criteria=StoppingCriteriaList(stop),
    )
    done = out[:, start:]
    if stragglers is None:
        return done
    left = _unended(done, eos).nonzero().view(-1)
    budget = sampling["max_new_tokens"] - done.shape[1]
    if len(left) == 0 or budget <= 0:
        return done
    mask = torch.cat([enc["attention_mask"].repeat_interleave(n, 0)[left], torch.ones_like(done[left])], 1)
    more = model.generate(
        input_ids=out[left],
        attention_mask=mask,
        **{**sampling, "max_new_tokens": budget},
        cache_implementation=cache_implementation,
    )[:, out.shape[1] :]
    full = done.new_full((len(done), done.shape[1] + more.shape[1]), sampling["pad_token_id"])
    full[:, : done.shape[1]] = done
    full[left, done.shape[1] :] = more
    return full


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

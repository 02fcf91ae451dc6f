"""Reward functions in TRL's signature: ``f(prompts, completions, answer=..., **kw) -> list[float]``.

Exact-match answers score ±1 as in the paper; a format reward checks the
``<think>…</think><answer>…</answer>`` structure. A recipe composes them with weights in
one line (``reward: {exact_match: 1.0, format: 0.1}``, seed 003's style), passed to TRL as
``reward_funcs`` + ``reward_weights``. ``math`` uses math-verify for real datasets such as
Polaris-53K; ``rouge_l`` scores free-text answers (sentences) by ROUGE-L F1 (Google's
``rouge-score``) against the reference; the length-control axis uses TRL's soft overlong punishment.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import cache

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
FORMAT_RE = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)

RewardFn = Callable[..., list[float]]


def _text(completion) -> str:
    """TRL passes strings for plain prompts and message lists for conversational ones."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def extract_answer(completion) -> str | None:
    found = ANSWER_RE.findall(_text(completion))
    return found[-1].strip() if found else None


def is_well_formed(completion) -> bool:
    return FORMAT_RE.match(_text(completion)) is not None


def exact_match(prompts, completions, answer: Sequence[str], **_) -> list[float]:
    """+1 when the last <answer> equals the reference exactly, else -1."""
    return [1.0 if extract_answer(c) == str(a).strip() else -1.0 for c, a in zip(completions, answer, strict=True)]


def format_reward(prompts, completions, **_) -> list[float]:
    """+1 for <think>…</think><answer>…</answer>, else -1."""
    return [1.0 if is_well_formed(c) else -1.0 for c in completions]


def math_verify_reward(prompts, completions, answer: Sequence[str], **_) -> list[float]:
    """+1 when math-verify finds the <answer> (or the whole text) equivalent to the reference, else -1."""
    from math_verify import parse, verify

    out = []
    for c, a in zip(completions, answer, strict=True):
        pred = extract_answer(c) or _text(c)
        gold = parse(f"${a}$") or parse(str(a))
        try:
            ok = bool(gold) and verify(gold, parse(f"${pred}$") or parse(pred))
        except Exception:  # math-verify raises on unparsable input; that is a wrong answer
            ok = False
        out.append(1.0 if ok else -1.0)
    return out


@cache
def _rouge_scorer():
    from rouge_score.rouge_scorer import RougeScorer  # noqa: PLC0415 - only free-text recipes need it

    return RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l_reward(prompts, completions, answer: Sequence[str], **_) -> list[float]:
    """2 x ROUGE-L F1 - 1 between the <answer> (or the whole text, without tags) and the reference
    sentence: in [-1, 1] like the other rewards, so a sample counts as correct for mean@16 when
    F1 > 0.5."""
    scorer = _rouge_scorer()
    out = []
    for c, a in zip(completions, answer, strict=True):
        pred = extract_answer(c)
        pred = _text(c) if pred is None else pred
        out.append(2.0 * scorer.score(str(a), pred)["rougeL"].fmeasure - 1.0)
    return out


REWARDS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "format": format_reward,
    "math": math_verify_reward,
    "rouge_l": rouge_l_reward,
}


def correct(completion, answer: str, kind: str = "exact_match") -> bool:
    """Whether one completion is right: the pass criterion of validation mean@16."""
    return REWARDS[kind]([None], [completion], answer=[answer])[0] > 0

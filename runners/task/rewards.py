"""Reward functions in TRL's signature: ``f(prompts, completions, answer=..., **kw) -> list[float]``.

Exact-match answers score ±1 as in the paper; a format reward checks the
``<think>…</think><answer>…</answer>`` structure. A recipe composes them with weights in
one line (``reward: {exact_match: 1.0, format: 0.1}``, seed 003's style), passed to TRL as
``reward_funcs`` + ``reward_weights``. ``math`` uses math-verify for real datasets such as
Polaris-53K; ``rouge_l`` scores free-text answers (sentences) by ROUGE-L F1 (Google's
``rouge-score``) against the reference; ``bertscore`` by BERTScore F1 with a local encoder model
(``data.bertscore``: nothing is downloaded); the length-control axis uses TRL's soft
overlong punishment. ``reward_function`` builds a reward from its name and its recipe section.
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


class BertScoreReward:
    """(F1 - threshold) / (1 - threshold), clipped to [-1, 1], where F1 is BERTScore (Zhang et al.
    2020: greedy cosine matching of contextual token embeddings; no IDF, no baseline rescaling)
    between the <answer> (or the whole text) and the reference; a sample counts as correct for
    mean@16 when F1 > threshold. Raw F1 is high for any two sentences (often 0.8-0.9 with
    roberta-large): choose the threshold for your model. The encoder is a local folder, loaded
    once, on the GPU when there is one. Computed here with transformers from the definition:
    torchmetrics 1.9's BERTScore returns pairs' scores out of order when lengths tie (its issue
    #2728; a test here caught it)."""

    __name__ = "bertscore"

    def __init__(self, model: str, threshold: float = 0.9, num_layers: int | None = None, batch: int = 64) -> None:
        self.model, self.threshold, self.num_layers, self.batch = model, threshold, num_layers, batch
        self._encoder = self._tokenizer = None

    def _embed(self, texts: list[str]) -> list:
        """Unit-norm embeddings of each text's tokens (special tokens and padding left out)."""
        import torch  # noqa: PLC0415
        from transformers import AutoModel, AutoTokenizer  # noqa: PLC0415

        if self._encoder is None:
            self._tokenizer = AutoTokenizer.from_pretrained(self.model)
            device = "cuda" if torch.cuda.is_available() else "cpu"
            self._encoder = AutoModel.from_pretrained(self.model).eval().to(device)
        out = []
        for start in range(0, len(texts), self.batch):
            enc = self._tokenizer(
                texts[start : start + self.batch],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=512,
                return_special_tokens_mask=True,
            )
            keep = enc.pop("special_tokens_mask").eq(0) & enc["attention_mask"].bool()
            with torch.no_grad():
                res = self._encoder(**enc.to(self._encoder.device), output_hidden_states=self.num_layers is not None)
            h = res.last_hidden_state if self.num_layers is None else res.hidden_states[self.num_layers]
            h = torch.nn.functional.normalize(h.float(), dim=-1).cpu()
            out += [h[i][keep[i]] for i in range(h.shape[0])]
        return out

    def __call__(self, prompts, completions, answer: Sequence[str], **_) -> list[float]:
        preds = []
        for c in completions:
            pred = extract_answer(c)
            preds.append(_text(c) if pred is None else pred)
        scored = [i for i, p in enumerate(preds) if p.strip()]
        out = [-1.0] * len(preds)
        cands, refs = self._embed([preds[i] for i in scored]), self._embed([str(answer[i]) for i in scored])
        for i, c, r in zip(scored, cands, refs, strict=True):
            if len(c) == 0 or len(r) == 0:
                continue
            sim = c @ r.T
            p, rec = sim.max(1).values.mean().item(), sim.max(0).values.mean().item()
            f1 = 2 * p * rec / (p + rec) if p + rec > 0 else 0.0
            out[i] = max(-1.0, min(1.0, (f1 - self.threshold) / (1.0 - self.threshold)))
        return out


REWARDS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "format": format_reward,
    "math": math_verify_reward,
    "rouge_l": rouge_l_reward,
}
CONFIGURED = {"bertscore": BertScoreReward}  # rewards that need a recipe section (data.<name>)
NAMES = [*REWARDS, *CONFIGURED]


def reward_function(name: str, settings: dict | None = None) -> RewardFn:
    """The reward called ``name``; a configured one is built from its recipe section's fields."""
    if name in CONFIGURED:
        return CONFIGURED[name](**(settings or {}))
    return REWARDS[name]


def correct(completion, answer: str, kind: str = "exact_match") -> bool:
    """Whether one completion is right: the pass criterion of validation mean@16."""
    return REWARDS[kind]([None], [completion], answer=[answer])[0] > 0

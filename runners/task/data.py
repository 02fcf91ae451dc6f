"""Train/validation rows of a recipe's data section: the embedded task, or a local JSONL dataset."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Protocol

from runners.task.tasks import ArithmeticTask, load_jsonl, render_prompt

INSTRUCTION = "Think inside <think></think>, then give the final answer inside <answer></answer>."


class DataSection(Protocol):
    """What ``load_rows`` reads of a recipe's ``data`` section (``runners.recipe.DataConfig``)."""

    path: str | None
    val_path: str | None
    problem_field: str
    answer_field: str
    task: ArithmeticTask
    train_prompts: int | None


def _prompt(problem: str, tokenizer) -> str | list[dict]:
    if getattr(tokenizer, "chat_template", None):
        return [{"role": "user", "content": f"{problem}\n{INSTRUCTION}"}]
    return render_prompt(problem)


def load_rows(data: DataSection, tokenizer, *, eval_prompts: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, validation) rows with "prompt", "answer" and a stable "prompt_id": the first
    ``eval_prompts`` validation rows (the recipe's ``eval.prompts``). A dataset without ``val_path``
    holds out ``eval_prompts`` of its rows, drawn with ``seed`` (the recipe's ``train.seed``)."""
    if data.path is None:
        train, val = data.task.splits()
    else:
        train, val = _read_splits(data, eval_prompts, seed)
        train = [{**r, "prompt": _prompt(r["problem"], tokenizer)} for r in train]
        val = [{**r, "prompt": _prompt(r["problem"], tokenizer)} for r in val]
    if data.train_prompts is not None:  # a small pool is revisited within the budget (No-Positive-Resampling acts)
        train = train[: data.train_prompts]
    train = [{"prompt": r["prompt"], "answer": r["answer"], "prompt_id": i} for i, r in enumerate(train)]
    return train, val[:eval_prompts]


def _read_splits(data: DataSection, eval_prompts: int, seed: int) -> tuple[list[dict], list[dict]]:
    """A dataset file's (train, validation) rows: ``val_path``'s rows, or ``eval_prompts`` rows held
    out of ``path`` (drawn with ``seed``), none of whose problems stays in training."""
    fields = {"problem_field": data.problem_field, "answer_field": data.answer_field}
    rows = load_jsonl(data.path, **fields)
    if data.val_path is not None:
        return rows, load_jsonl(data.val_path, **fields)
    if len(rows) < 2 * eval_prompts:
        raise ValueError(
            f"dataset {Path(data.path)}: {len(rows)} rows cannot hold out eval.prompts = {eval_prompts} "
            "and still train; set data.val_path or lower eval.prompts"
        )
    order = list(range(len(rows)))
    random.Random(f"holdout-{seed}").shuffle(order)
    held = set(order[:eval_prompts])
    val = [rows[i] for i in sorted(held)]
    val_problems = {r["problem"] for r in val}
    return [r for i, r in enumerate(rows) if i not in held and r["problem"] not in val_problems], val

"""Train/validation rows for a recipe: the embedded task, or a local JSONL dataset."""

from __future__ import annotations

import random
from pathlib import Path

from runners.recipe import Recipe
from runners.task.tasks import ArithmeticTask, load_jsonl, render_prompt

INSTRUCTION = "Think inside <think></think>, then give the final answer inside <answer></answer>."


def task_of(recipe: Recipe) -> ArithmeticTask:
    return recipe.data.task


def _prompt(problem: str, tokenizer) -> str | list[dict]:
    if getattr(tokenizer, "chat_template", None):
        return [{"role": "user", "content": f"{problem}\n{INSTRUCTION}"}]
    return render_prompt(problem)


def load_rows(recipe: Recipe, tokenizer) -> tuple[list[dict], list[dict]]:
    """(train, validation) rows with "prompt", "answer" and a stable "prompt_id"."""
    d = recipe.data
    if d.path is None:
        train, val = task_of(recipe).splits()
    else:
        rows = load_jsonl(d.path, problem_field=d.problem_field, answer_field=d.answer_field)
        if d.val_path is not None:
            train, val = rows, load_jsonl(d.val_path, problem_field=d.problem_field, answer_field=d.answer_field)
        else:
            if len(rows) < 2 * recipe.eval.prompts:
                raise ValueError(
                    f"dataset {Path(d.path)}: {len(rows)} rows cannot hold out eval.prompts = {recipe.eval.prompts} "
                    "and still train; set data.val_path or lower eval.prompts"
                )
            order = list(range(len(rows)))
            random.Random(f"holdout-{recipe.train.seed}").shuffle(order)
            held = set(order[: recipe.eval.prompts])
            val = [rows[i] for i in sorted(held)]
            val_problems = {r["problem"] for r in val}
            train = [r for i, r in enumerate(rows) if i not in held and r["problem"] not in val_problems]
        train = [{**r, "prompt": _prompt(r["problem"], tokenizer)} for r in train]
        val = [{**r, "prompt": _prompt(r["problem"], tokenizer)} for r in val]
    if d.train_prompts is not None:  # a small pool is revisited within the budget (No-Positive-Resampling acts)
        train = train[: d.train_prompts]
    train = [{"prompt": r["prompt"], "answer": r["answer"], "prompt_id": i} for i, r in enumerate(train)]
    return train, val[: recipe.eval.prompts]

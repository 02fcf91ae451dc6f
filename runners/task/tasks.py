"""Synthetic verifiable reasoning tasks, and real problem/answer datasets from JSONL.

The embedded task is multi-step integer arithmetic written in the paper's format:

    prompt:      "Q: 7+5-3\n"
    completion:  "<think>7+5=12 12-3=9</think><answer>9</answer>"

Difficulty grows with the number of operands and their size. Demonstrations for the
supervised warm start make a mistake in each step with probability ``demo_error_rate``
(the chain stays self-consistent, so the final answer is wrong), which gives the base
model a pass rate well above zero and well below its pass@16: room for RL to sharpen.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"


@dataclass(frozen=True)
class ArithmeticTask:
    """A deterministic family of arithmetic problems; train and validation never overlap."""

    min_operands: int = 2
    max_operands: int = 4
    max_operand: int = 9
    ops: str = "+-"
    demo_error_rate: float = 0.3
    n_train: int = 20_000
    n_val: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        if not 2 <= self.min_operands <= self.max_operands:
            raise ValueError(
                f"task: need 2 <= min_operands <= max_operands, got {self.min_operands}, {self.max_operands}"
            )
        if self.max_operand < 1 or not self.ops or set(self.ops) - set("+-"):
            raise ValueError(f"task: max_operand >= 1 and ops from '+-' required, got {self.max_operand}, {self.ops!r}")
        if not 0.0 <= self.demo_error_rate < 1.0:
            raise ValueError(f"task: demo_error_rate must be in [0, 1), got {self.demo_error_rate}")
        if self.n_val < 1 or self.n_train < 1:
            raise ValueError("task: n_train and n_val must be >= 1")
        if self.n_val > self.space_size() // 2:
            raise ValueError(
                f"task: n_val = {self.n_val} leaves too few distinct problems for training "
                f"({self.space_size()} exist); lower n_val or widen max_operand / max_operands"
            )

    def space_size(self) -> int:
        """How many distinct problems the task can produce."""
        n, ops = self.max_operand + 1, len(set(self.ops))
        return sum(n**k * ops ** (k - 1) for k in range(self.min_operands, self.max_operands + 1))

    def _problem(self, rng: random.Random) -> str:
        k = rng.randint(self.min_operands, self.max_operands)
        expr = str(rng.randint(0, self.max_operand))
        for _ in range(k - 1):
            expr += rng.choice(self.ops) + str(rng.randint(0, self.max_operand))
        return expr

    def _split(self) -> tuple[list[str], list[str]]:
        rng = random.Random(f"arith-{self.seed}")
        val: list[str] = []
        seen: set[str] = set()
        for _ in range(100 * self.n_val):
            if len(val) == self.n_val:
                break
            p = self._problem(rng)
            if p not in seen:
                seen.add(p)
                val.append(p)
        train = []
        for _ in range(self.n_train):
            p = self._problem(rng)
            while p in seen:  # no validation prompt appears in training
                p = self._problem(rng)
            train.append(p)
        return train, val

    def splits(self) -> tuple[list[dict], list[dict]]:
        """Train and validation rows: {"prompt", "answer", "problem", "difficulty"}."""
        train, val = self._split()
        return [self.row(p) for p in train], [self.row(p) for p in val]

    def row(self, problem: str) -> dict:
        return {
            "prompt": render_prompt(problem),
            "answer": str(solve(problem)),
            "problem": problem,
            "difficulty": len(tokens(problem)) // 2,
        }

    def demonstration(self, problem: str, rng: random.Random) -> str:
        """A completion whose each step is wrong (by ±1..2) with probability demo_error_rate."""
        parts = tokens(problem)
        acc, steps = int(parts[0]), []
        for op, num in zip(parts[1::2], parts[2::2], strict=True):
            new = acc + int(num) if op == "+" else acc - int(num)
            if rng.random() < self.demo_error_rate:
                new += rng.choice((-2, -1, 1, 2))
            steps.append(f"{acc}{op}{num}={new}")
            acc = new
        return f"{THINK_OPEN}{' '.join(steps)}{THINK_CLOSE}{ANSWER_OPEN}{acc}{ANSWER_CLOSE}"

    def max_completion_chars(self) -> int:
        return len(self.demonstration(self._widest(), random.Random(0))) + 8

    def _widest(self) -> str:
        n = self.max_operand
        return "-".join([str(n)] * self.max_operands)

    def to_dict(self) -> dict:
        return asdict(self)


def tokens(problem: str) -> list[str]:
    """'12+3-4' → ['12', '+', '3', '-', '4']"""
    out, cur = [], ""
    for ch in problem:
        if ch in "+-" and cur:
            out += [cur, ch]
            cur = ""
        else:
            cur += ch
    return out + [cur]


def solve(problem: str) -> int:
    parts = tokens(problem)
    acc = int(parts[0])
    for op, num in zip(parts[1::2], parts[2::2], strict=True):
        acc = acc + int(num) if op == "+" else acc - int(num)
    return acc


def render_prompt(problem: str) -> str:
    return f"Q: {problem}\n"


def load_jsonl(path: str | Path, *, problem_field: str = "problem", answer_field: str = "answer") -> list[dict]:
    """Rows {"problem", "answer"} from a JSONL file (Polaris-style); a clear error per bad row."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"dataset {p}: no such file")
    rows = []
    with p.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"dataset {p} line {i}: not valid JSON ({e.msg})") from None
            for field in (problem_field, answer_field):
                if field not in obj or obj[field] in (None, ""):
                    raise ValueError(f"dataset {p} line {i}: missing field {field!r} (fields: {', '.join(obj)})")
            rows.append({"problem": str(obj[problem_field]), "answer": str(obj[answer_field])})
    if not rows:
        raise ValueError(f"dataset {p}: no rows")
    return rows

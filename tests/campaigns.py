"""What the end-to-end tests share: a tiny campaign file, a run's MLflow history, whether a
campaign's runs ran together, and an MLflow server's health."""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

from runners.tracking.mlflow_server import answers

TINY = {  # the tiny model's cheapest run: a few seconds a step on one CPU core
    "model.size": "tiny",
    "batch.prompts": 2,
    "batch.generations": 4,
    "batch.micro_batch": 8,
    "length.think_budget": [12, 20],
    "length.answer_budget": 8,
    "eval.prompts": 8,
    "eval.samples": 4,
    "eval.batch_prompts": 8,
}


def write_campaign(path: Path, name: str, steps: int, axes: dict, **extra) -> Path:
    """A LOO campaign file of :data:`TINY` runs of ``steps`` steps (a checkpoint and an evaluation
    every 2), seed 0, over ``axes`` (``{}``: the baseline alone, written with no ``axes``
    key, as an empty one is refused); ``extra`` adds or replaces top-level keys."""
    overrides = {**TINY, "train.steps": steps, "train.save_every": 2, "eval.every": 2}
    doc = {
        "name": name,
        "baseline": "scalerl",
        "kind": "loo",
        "seeds": [0],
        "overrides": overrides,
        **({"axes": axes} if axes else {}),
        "fit": {"x": "compute/gpu_hours", "a_grid": "0.05:1.0:0.005"},
        **extra,
    }
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def history_steps(client, run_id: str, key: str) -> list[int]:
    """The steps at which a run logged ``key``, every one it logged (a step twice shows twice)."""
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def assert_ran_together(lines: list[str], client, runs, interleaved: bool = True) -> None:
    """The campaign's runs really ran at the same time: all were started before the first one
    ended, and (``interleaved``) the store took their writes interleaved (which pairs overlap depends
    on the load; runs of very different lengths, a 27k-parameter model's 1 s of writes beside a
    larger one's, need not overlap in their writes, only in their processes)."""
    first_end = next(i for i, x in enumerate(lines) if "] done " in x or "] FAILED " in x)
    assert sum("] start " in x for x in lines[:first_end]) == len(runs), lines
    if not interleaved:
        return
    spans = []
    for r in runs:
        stamps = [m.timestamp for key in r.data.metrics for m in client.get_metric_history(r.info.run_id, key)]
        spans.append((min(stamps), max(stamps)))
    assert any(a[0] <= b[1] and b[0] <= a[1] for a, b in itertools.combinations(spans, 2)), spans


def trainers(run: str = "", among: Iterable[psutil.Process] | None = None) -> list[psutil.Process]:
    """The ``runners train`` processes (of this machine, or ``among`` these) whose command line
    names ``run`` (a run folder, or the start of one); processes gone meanwhile are left out."""
    found = []
    for p in psutil.process_iter() if among is None else among:
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(p.cmdline())
            if "runners train" in cmd and run in cmd:
                found.append(p)
    return found


def wait_healthy(base: str, proc: subprocess.Popen | None = None, timeout: float = 120) -> None:
    """Until the MLflow server at ``base`` answers ``/health`` with 200; fails if ``proc`` (the
    command that serves it) exits first, or after ``timeout`` seconds."""
    deadline = time.time() + timeout
    while not answers(base):
        assert proc is None or proc.poll() is None, f"exited with {proc.returncode} before answering"
        assert time.time() < deadline, f"no MLflow server answered at {base}"
        time.sleep(0.5)

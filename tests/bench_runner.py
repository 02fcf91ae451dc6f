"""``make bench-runner``: the project's runner against a plain TRL ``GRPOTrainer`` script, same settings.

1. plain TRL: ``GRPOTrainer`` with the recipe's TRL arguments and rewards, nothing else;
2. the runner: ``runners.rl.train.train`` on the same recipe (``ScaleRLTrainer`` + evaluation callbacks), with
   the axes plain TRL cannot express set to TRL's own behaviour (uniform sampling, no zero-variance filter,
   token aggregation, length penalty, no pipeline lag), so both do the same work;
3. the full baseline through the runner at the recipe's evaluation cadence: evaluation's share of run time.

Training throughput counts completion tokens over the time from each step's start to its optimizer step
(evaluation, which runs after the optimizer step, is excluded; the first step is warm-up and is dropped).
One short run is noise (30-step ratios of 1.186, 0.969 and 1.018 were measured on one H100), so each
measurement is repeated ``--repeats`` times, interleaved, and the median is reported with its range.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from runners.recipe import load_recipe, parse_override
from runners.rl.plan import trl_args
from runners.rl.train import prepare_model, reward_setup, train

TRL_EQUIVALENT = {
    "algorithm.sampling": "uniform",
    "algorithm.zero_variance_filter": False,
    "algorithm.aggregation": "token",
    "algorithm.pipeline_lag": 0,
    "length.control": "penalty",
}


class Throughput(TrainerCallback):
    """Seconds from each step's start to its optimizer step, and completion tokens per step."""

    def __init__(self, rollouts: int) -> None:
        self.rollouts, self.seconds, self.tokens, self._t = rollouts, [], [], 0.0

    def on_step_begin(self, args, state, control, **kw):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._t = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kw):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.seconds.append(time.perf_counter() - self._t)

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "completions/mean_length" in logs:
            self.tokens.append(logs["completions/mean_length"] * self.rollouts)

    def summary(self) -> dict[str, float]:
        secs, toks = sum(self.seconds[1:]), sum(self.tokens[1:])
        return {"steps": len(self.seconds) - 1, "train_seconds": secs, "completion_tokens_per_s": toks / secs}


def plain_trl(recipe, out: Path) -> dict[str, float]:
    from runners.task.data import load_rows

    model, tok = prepare_model(recipe)
    rows, _ = load_rows(recipe.data, tok, eval_prompts=recipe.eval.prompts, seed=recipe.train.seed)
    funcs, weights = reward_setup(recipe)
    meter = Throughput(recipe.rollouts)
    args = GRPOConfig(
        output_dir=str(out),
        **trl_args(recipe),
        reward_weights=weights,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model, args=args, reward_funcs=funcs, train_dataset=Dataset.from_list(rows), processing_class=tok
    )
    trainer.add_callback(meter)
    trainer.train()
    return meter.summary()


def runner(recipe, out: Path) -> dict[str, float]:
    meter = Throughput(recipe.rollouts)
    peaks: dict[str, float] = {}

    def sink(metrics: dict[str, float], step: int) -> None:  # the profiler's run-wide and evaluation peaks
        for k, v in metrics.items():
            if k.endswith(("peak_allocated_gb", "evaluation_allocated_gb")):
                peaks[k] = max(peaks.get(k, 0.0), v)

    shutil.rmtree(out, ignore_errors=True)  # a fresh run: a checkpoint left by an earlier bench would resume
    t0 = time.perf_counter()
    train(recipe, out, sinks=[sink], log=lambda m: print(m, flush=True), callbacks=[meter])
    wall = time.perf_counter() - t0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    last = lines[-1]
    evals = [x["val/sequences_per_second"] for x in lines]
    return {
        **meter.summary(),
        "wall_seconds": wall,
        "eval_seconds": last["time/eval_seconds_total"],
        "eval_seconds_each": last["time/eval_seconds_total"] / len(lines),
        "step_seconds": last["compute/train_seconds"] / recipe.train.steps,
        "eval_sequences_per_s": sum(evals) / len(evals),
        "peak_gpu_gb": max(peaks.values(), default=0.0),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench_runner", description=__doc__.splitlines()[0])
    p.add_argument("recipe", nargs="?", default="scalerl-gpu" if torch.cuda.is_available() else "scalerl")
    p.add_argument("--steps", type=int, default=30, help="training steps of each measured run")
    p.add_argument("--out", type=Path, default=Path("artifacts/bench-runner"))
    p.add_argument("--json", type=Path, help="also write the numbers here")
    p.add_argument("--repeats", type=int, default=3, help="times each measurement runs (median, range)")
    p.add_argument("--eval-every", type=int, help="evaluation cadence of the full-baseline run (default: the recipe's)")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a recipe key in every run, e.g. --set model.generation_cache=static (repeatable)",
    )
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats}: need at least 1")

    steps = {"train.steps": args.steps, "train.save_every": args.steps}
    steps.update(parse_override(s) for s in args.set or [])
    same = load_recipe(args.recipe, {**steps, **TRL_EQUIVALENT, "eval.every": args.steps})
    full = load_recipe(args.recipe, {**steps, **({"eval.every": args.eval_every} if args.eval_every else {})})
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    print(f"recipe {args.recipe}, {args.steps} steps, {same.rollouts} completions/step, device {device}", flush=True)
    prepare_model(full)  # build the base model once, outside every timing
    res: dict = {"recipe": args.recipe, "device": device, "steps": args.steps, "set": args.set or [], "repeats": []}
    for r in range(args.repeats):  # interleaved, so a slow spell of the machine hits every measurement alike
        one: dict = {}
        for name, fn in (
            ("plain_trl", lambda: plain_trl(same, args.out / "plain")),
            ("runner", lambda: runner(same, args.out / "runner")),
            ("runner_full_baseline", lambda: runner(full, args.out / "full")),
        ):
            t0 = time.perf_counter()
            one[name] = fn()
            took = time.perf_counter() - t0
            print(f"[{r + 1}/{args.repeats}] {name}: {json.dumps(one[name])} ({took:.0f} s)", flush=True)
        one["overhead_ratio"] = one["plain_trl"]["completion_tokens_per_s"] / one["runner"]["completion_tokens_per_s"]
        f = one["runner_full_baseline"]  # one evaluation per `every` training steps, the campaign's cadence
        one["eval_share"] = f["eval_seconds_each"] / (f["eval_seconds_each"] + full.eval.every * f["step_seconds"])
        res["repeats"].append(one)
    reps = res["repeats"]
    for key, get in (
        ("plain_tokens_per_s", lambda x: x["plain_trl"]["completion_tokens_per_s"]),
        ("runner_tokens_per_s", lambda x: x["runner"]["completion_tokens_per_s"]),
        ("full_tokens_per_s", lambda x: x["runner_full_baseline"]["completion_tokens_per_s"]),
        ("overhead_ratio", lambda x: x["overhead_ratio"]),
        ("eval_share", lambda x: x["eval_share"]),
        ("eval_sequences_per_s", lambda x: x["runner_full_baseline"]["eval_sequences_per_s"]),
        ("peak_gpu_gb", lambda x: x["runner_full_baseline"]["peak_gpu_gb"]),
    ):
        values = [get(x) for x in reps]
        res[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")

    def show(key: str, fmt: str) -> str:
        m = res[key]
        return f"{m['median']:{fmt}} (range {m['min']:{fmt}}-{m['max']:{fmt}})"

    print(f"\nmedians of {args.repeats} interleaved repeats, {args.steps} steps each (range = min-max):")
    print(f"{'plain TRL GRPOTrainer':34}{show('plain_tokens_per_s', '.0f')} completion tok/s")
    print(f"{'runner (same settings)':34}{show('runner_tokens_per_s', '.0f')} completion tok/s")
    print(f"{'overhead ratio plain/runner':34}{show('overhead_ratio', '.3f')} (target <= 1.05)")
    print(f"{'runner, full baseline recipe':34}{show('full_tokens_per_s', '.0f')} completion tok/s")
    print(
        f"evaluation: {show('eval_sequences_per_s', '.0f')} sequences/s; {show('eval_share', '.3f')} of run time at "
        f"eval.every = {full.eval.every} (target <= 0.15); peak GPU memory {res['peak_gpu_gb']['max']:.2f} GiB"
    )


if __name__ == "__main__":
    main()

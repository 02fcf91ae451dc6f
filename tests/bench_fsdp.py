"""``make bench-fsdp``: peak memory on each GPU and tokens/s of a short run, on one GPU, DDP or FSDP.

``python -m tests.bench_fsdp RECIPE --gpus N [--accelerate-config FILE] [--random-model LxH | --model
PATH] [--set KEY=VALUE ...]`` runs a short run of the recipe (``SHORT``: 4 steps of 8 prompts x 4
completions) with the runner's own ``train`` (untracked) on N processes through ``accelerate launch``,
as ``python -m runners train --gpus N`` does, and records:

- on every process, the runner's peak CUDA memory over generation, reward and update (allocated
  and reserved: ``memory/peak_*`` of its PhaseProfiler) and, on the first, evaluation's;
- on the first process, tokens/s: prompt + completion tokens generated over training seconds
  (evaluation excluded) for the whole run, and for its last step (warm: the first compiles and fills caches);
- the memory estimate for each GPU (runners.rl.memory, for the run's layout) beside the peaks;
- how it ended: ``ok``, ``out of memory`` (CUDA's error, caught on any process), or the refusal of
  the estimate (``--no-memory-check`` lets a run the estimate refuses go ahead, to see the real outcome).

``--random-model LAYERSxHIDDEN`` builds an untrained Llama of that shape (tests.bench_memory; memory and
speed do not depend on what it has learnt). Appends one row to OUT/fsdp.csv (default
artifacts/bench-fsdp) and prints it; the processes' output is in OUT/runs/LABEL/launch.log.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

GB = 2**30


# a short run (results/fsdp's): 4 steps of 8 prompts x 4 completions of 32 tokens, no checkpoint,
# evaluation of 8 prompts x 4 at steps 0 and 4; --set overrides any of it
SHORT = {
    "batch.prompts": 8,
    "batch.generations": 4,
    "batch.micro_batch": 8,
    "length.control": "none",
    "length.max_tokens": 32,
    "train.steps": 4,
    "train.save_every": 100,
    "eval.every": 4,  # at step 0 and the end only
    "eval.prompts": 8,
    "eval.samples": 4,
    "eval.batch_prompts": 4,
}


def overrides(args: argparse.Namespace) -> dict:
    from runners.recipe import parse_override

    over = {**SHORT, **dict(parse_override(s) for s in args.set or [])}
    if args.model is not None:
        over.update({"model.path": str(args.model), "model.size": None})
    return over


def one(args: argparse.Namespace) -> None:
    """Inside each launched process: the run, then this process's numbers in RUN_DIR/rank<R>.json."""
    from transformers import TrainerCallback

    from runners.recipe import RecipeError, load_recipe
    from runners.rl import train as runner

    rank = int(os.environ.get("RANK", "0"))
    recipe = load_recipe(args.recipe, overrides(args))
    if args.no_memory_check:
        runner.check_fits = lambda *a, **k: None  # measure what the estimate would have refused

    class Peaks(TrainerCallback):
        def __init__(self) -> None:
            self.allocated = self.reserved = 0.0
            self.steps: dict[int, dict[str, float]] = {}

        def on_log(self, args, state, control, logs=None, **kw):
            logs = logs or {}
            self.allocated = max(self.allocated, logs.get("memory/peak_allocated_gb", 0.0))
            self.reserved = max(self.reserved, logs.get("memory/peak_reserved_gb", 0.0))
            keep = {k: v for k, v in logs.items() if k.startswith("time/") or k == "num_tokens"}
            self.steps.setdefault(state.global_step, {}).update(keep)

    peaks = Peaks()
    out: dict = {"rank": rank, "status": "ok"}
    t0 = time.perf_counter()
    try:
        say = (lambda m: print(m, flush=True)) if rank == 0 else (lambda m: None)
        final = runner.train(recipe, args.run_dir, log=say, callbacks=[peaks])
        out.update({k: v for k, v in final.items() if k.startswith("compute/")})
    except (RecipeError, torch.OutOfMemoryError) as e:
        text = str(e).splitlines()[0]
        out.update(status="out of memory" if "out of" in text and "memory" in text else "refused", message=text)
    out["seconds"] = time.perf_counter() - t0
    out["peak_allocated_gb"] = peaks.allocated
    out["peak_reserved_gb"] = peaks.reserved
    timed = [s for _, s in sorted(peaks.steps.items()) if "num_tokens" in s and "time/update_seconds" in s]
    if len(timed) >= 2:
        last, before = timed[-1], timed[-2]
        busy = sum(last.get(f"time/{p}_seconds", 0.0) for p in ("generation", "reward", "update"))
        out["last_step_tokens_per_s"] = (last["num_tokens"] - before["num_tokens"]) / busy if busy else None
    Path(args.run_dir, f"rank{rank}.json").write_text(json.dumps(out) + "\n")
    if out["status"] != "ok":
        raise SystemExit(1)


def launch(args: argparse.Namespace, model: Path | None) -> list[str]:
    from runners.recipe import load_recipe
    from runners.tracking.server_processes import free_port

    recipe = load_recipe(args.recipe, overrides(args))
    inner = ["-m", "tests.bench_fsdp", args.recipe, "--one", "--run-dir", str(args.run_dir)]
    inner += [f"--set={s}" for s in args.set or []] + (["--model", str(model)] if model else [])
    inner += ["--no-memory-check"] if args.no_memory_check else []
    if args.gpus == 1:
        return [sys.executable, *inner]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(args.gpus)]
    if args.accelerate_config:
        cmd += ["--config_file", str(args.accelerate_config)]
    else:
        cmd += ["--multi_gpu", "--num_machines", "1", "--dynamo_backend", "no"]
    cmd += ["--mixed_precision", "bf16" if recipe.model.dtype == "bfloat16" else "no"]
    return cmd + ["--main_process_port", str(free_port()), *inner]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench_fsdp", description=__doc__.splitlines()[0])
    p.add_argument("recipe")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--accelerate-config", type=Path, help="an accelerate config (FSDP); without: DDP")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="recipe override (repeatable)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--model", type=Path, help="a local Hugging Face checkpoint")
    where.add_argument("--random-model", metavar="LAYERSxHIDDEN", help="an untrained Llama, e.g. 28x4096 (5.8B)")
    p.add_argument("--no-memory-check", action="store_true", help="run even where the estimate refuses")
    p.add_argument("--label", help="the row's name (default: from the layout)")
    p.add_argument("--out", type=Path, default=Path("artifacts/bench-fsdp"))
    p.add_argument("--timeout", type=int, default=1800, help="seconds before the run is stopped")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        return one(args)

    from runners.recipe import load_recipe
    from runners.rl.memory import estimate, model_dims
    from runners.rl.sharding import Layout
    from tests.bench_memory import random_model

    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model
    if args.random_model:
        model = random_model(args.random_model, args.out, device="cuda" if torch.cuda.is_available() else "cpu")
    layout = Layout.from_config(args.accelerate_config, args.gpus)
    label = args.label or layout.describe()
    args.run_dir = args.out / "runs" / label.replace(" ", "-")
    shutil.rmtree(args.run_dir, ignore_errors=True)  # a fresh run, never a resumed one
    args.run_dir.mkdir(parents=True)
    args.model = model
    recipe = load_recipe(args.recipe, overrides(args))
    est = estimate(recipe, layout=layout)
    subject = args.recipe + (f" with {model.name}" if model else "")
    print(f"[{label}] {subject}: estimate {est['peak']:.1f} GiB per GPU", flush=True)
    t0 = time.perf_counter()
    launch_log = args.run_dir / "launch.log"  # the processes' own output
    try:
        with launch_log.open("w") as fh:
            subprocess.run(launch(args, model), stdout=fh, stderr=subprocess.STDOUT, timeout=args.timeout)
        tail = launch_log.read_text()[-3000:]
    except subprocess.TimeoutExpired:
        tail = f"stopped after {args.timeout} s"
    ranks = [json.loads(f.read_text()) for f in sorted(args.run_dir.glob("rank*.json"))]
    first = next((r for r in ranks if r["rank"] == 0), {})
    statuses = sorted({r["status"] for r in ranks}) or ["failed"]
    metrics = args.run_dir / "metrics.jsonl"
    evals = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    seconds, tokens = first.get("compute/train_seconds", 0.0), first.get("compute/tokens", 0.0)
    best = sum(f.stat().st_size for f in (args.run_dir / "best").glob("*.safetensors")) / GB
    for part in ("best", "checkpoints"):  # GBs each for a large model; the numbers are what this keeps
        shutil.rmtree(args.run_dir / part, ignore_errors=True)
    row = {
        "label": label,
        "recipe": args.recipe,
        "model": model.name if model else (recipe.model.size or recipe.model.path),
        "parameters": model_dims(recipe).params,
        "gpus": args.gpus,
        "layout": layout.describe(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU",
        "status": "/".join(statuses),
        "message": next((r["message"] for r in ranks if r.get("message")), "" if ranks else tail[-500:]),
        "estimate_gib_per_gpu": est["peak"],
        "peak_allocated_gib_max": max((r["peak_allocated_gb"] for r in ranks), default=float("nan")),
        "peak_allocated_gib_each": " ".join(f"{r['peak_allocated_gb']:.2f}" for r in ranks),
        "peak_reserved_gib_max": max((r["peak_reserved_gb"] for r in ranks), default=float("nan")),
        "evaluation_allocated_gib": max((e.get("memory/evaluation_allocated_gb", 0.0) for e in evals), default=0.0),
        "steps": max((e["step"] for e in evals), default=0),
        "train_seconds": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds if seconds else None,
        "last_step_tokens_per_s": first.get("last_step_tokens_per_s"),
        "best_safetensors_gib": best,  # a whole fp32 model: 4 bytes per parameter
        "wall_seconds": time.perf_counter() - t0,
    }
    csv = args.out / "fsdp.csv"
    pd.DataFrame([row]).to_csv(csv, mode="a", header=not csv.is_file(), index=False)
    print(json.dumps(row, indent=1, default=str), flush=True)
    if row["status"] == "failed":
        print(tail, flush=True)


if __name__ == "__main__":
    main()

"""``make bench-runner`` part 2: a campaign's runs packed on one GPU versus one after another.

Runs the recipe's baseline as a campaign of N seeds twice, with separate MLflow stores: once with
one run per device at a time (``runs_per_gpu: 1``, one after another) and once packed
(``runs_per_gpu: N``). ``--solo`` measures only the first run of the sequential campaign and
multiplies by N (the runs are identical in cost), to save device time; the report says which.
GPU utilisation is sampled with nvidia-smi while each campaign runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch
import yaml

from runners.campaign.runs import run_campaign


def sample_utilisation(stop: threading.Event, out: list[float]) -> None:
    while not stop.wait(2.0):
        try:
            res = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            out.extend(float(x) for x in res.stdout.split())
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return


def campaign_wall(recipe: str, seeds: list[int], per_gpu: int, steps: int, work: Path, name: str) -> dict:
    spec = {
        "name": name,
        "baseline": recipe,
        "kind": "loo",
        "seeds": seeds,
        "runs_per_gpu": per_gpu,
        "parallel": per_gpu,
        "overrides": {"train.steps": steps, "train.save_every": steps, "eval.every": 10},
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    util: list[float] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_utilisation, args=(stop, util), daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    summary = run_campaign(
        path, runs_root=work / "runs", tracking_uri=f"sqlite:///{work / name}.db", new_store=True, log=lambda m: None
    )
    wall = time.perf_counter() - t0
    stop.set()
    if summary["failures"]:
        raise SystemExit(f"{name}: {len(summary['failures'])} run(s) failed")
    return {"runs": len(seeds), "wall_seconds": wall, "gpu_util_mean": sum(util) / len(util) if util else None}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench_packing", description=__doc__.splitlines()[0])
    p.add_argument("recipe", nargs="?", default="scalerl-gpu" if torch.cuda.is_available() else "scalerl")
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--solo", action="store_true", help="time one run alone and multiply by --runs")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-packing-"))
    try:
        seq_seeds = [100] if args.solo else list(range(100, 100 + args.runs))
        seq = campaign_wall(args.recipe, seq_seeds, 1, args.steps, work, "sequential")
        seq_total = seq["wall_seconds"] * (args.runs if args.solo else 1)
        packed = campaign_wall(args.recipe, list(range(200, 200 + args.runs)), args.runs, args.steps, work, "packed")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = {
        "recipe": args.recipe,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "runs": args.runs,
        "steps": args.steps,
        "sequential_seconds": seq_total,
        "sequential_measured": "one run x runs" if args.solo else "all runs",
        "sequential_gpu_util": seq["gpu_util_mean"],
        "packed_seconds": packed["wall_seconds"],
        "packed_gpu_util": packed["gpu_util_mean"],
        "speedup": seq_total / packed["wall_seconds"],
    }
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    print(
        f"{args.runs} runs x {args.steps} steps of {args.recipe} on {res['device']}: one after another "
        f"{seq_total:.0f} s ({res['sequential_measured']}, GPU util {seq['gpu_util_mean']}), packed "
        f"{packed['wall_seconds']:.0f} s (GPU util {packed['gpu_util_mean']}) → {res['speedup']:.2f}x (target >= 3x)"
    )


if __name__ == "__main__":
    main()

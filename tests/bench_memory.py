"""``make bench-memory``: peak memory by phase as generations per prompt and completion length grow.

Each setting is a short real run of one recipe (``length.control=none`` so the completion budget is
exact, micro-batch = all rollouts so training activations grow with them) in its own process, so
peaks do not leak between settings. On a GPU the numbers are CUDA peak allocated memory per phase;
on CPU, the process's resident memory at the end of each phase and its lifetime peak.
``--baseline both`` repeats the sweep with RLOO's leave-one-out baseline beside GRPO's group mean
(seed 004's k = 2, 4, 8 generations per prompt sweep).
Writes artifacts/bench-memory/{memory.csv, memory.md, memory.png}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch

GENERATIONS = (2, 4, 8, 16)
LENGTHS = (32, 64, 128)


def one(
    recipe: str, generations: int, length: int, prompts: int, run_dir: Path, baseline: str = "group_mean"
) -> dict[str, float]:
    from runners.recipe import load_recipe
    from runners.train import train

    r = load_recipe(
        recipe,
        {
            "batch.generations": generations,
            "batch.prompts": prompts,
            "batch.micro_batch": prompts * generations,
            "length.control": "none",
            "length.max_tokens": length,
            "algorithm.off_policy": "pipeline",
            "algorithm.pipeline_lag": 0,
            "algorithm.advantage_baseline": baseline,
            "train.steps": 2,
            "train.save_every": 100,
            "eval.every": 100,
            "eval.prompts": 16,
        },
    )
    peaks: dict[str, float] = {}

    def sink(metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            if "memory/" in k:
                k = k.removeprefix("train/")
                peaks[k] = max(peaks.get(k, 0.0), v)

    train(r, run_dir, sinks=[sink], log=lambda m: None)
    return peaks


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench_memory", description=__doc__.splitlines()[0])
    p.add_argument("recipe", nargs="?", default="scalerl-gpu" if torch.cuda.is_available() else "scalerl")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    p.add_argument("--out", type=Path, default=Path("artifacts/bench-memory"))
    p.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help=f"max_tokens values {LENGTHS}")
    p.add_argument(
        "--baseline",
        choices=["group_mean", "leave_one_out", "both"],
        default="group_mean",
        help="advantage baseline: GRPO's group mean, RLOO's leave-one-out, or both side by side",
    )
    p.add_argument("--one", nargs=2, type=int, metavar=("GENERATIONS", "LENGTH"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        g, n = args.one
        run_dir = args.out / "runs" / f"{args.baseline}-g{g}-l{n}"
        print(json.dumps(one(args.recipe, g, n, args.prompts, run_dir, args.baseline)))
        return
    baselines = ["group_mean", "leave_one_out"] if args.baseline == "both" else [args.baseline]

    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(
        f"peak memory of recipe {args.recipe} on {device}: generations {GENERATIONS} x lengths {args.lengths}",
        flush=True,
    )
    rows = []
    for b, n, g in ((b, n, g) for b in baselines for n in args.lengths for g in GENERATIONS):
        cmd = [sys.executable, "-m", "tests.bench_memory", args.recipe, "--prompts", str(args.prompts)]
        cmd += ["--out", str(args.out), "--baseline", b, "--one", str(g), str(n)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"{b}, generations {g}, length {n} failed:\n{res.stderr[-2000:]}")
        peaks = json.loads(res.stdout.strip().splitlines()[-1])
        rows.append({"baseline": b, "generations": g, "max_tokens": n, "rollouts": g * args.prompts, **peaks})
        shown = "  ".join(
            f"{k.removeprefix('memory/')} {v:.3f}" for k, v in sorted(peaks.items()) if "peak" in k or "update_" in k
        )
        print(f"  {b:<13}  generations {g:>2}  max_tokens {n:>3}  {shown}", flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(args.out / "memory.csv", index=False)
    key = "memory/update_allocated_gb" if torch.cuda.is_available() else "memory/host_peak_rss_gb"
    table = df.pivot(index="generations", columns=["baseline", "max_tokens"], values=key)
    table.columns = [f"{'RLOO' if b == 'leave_one_out' else 'GRPO'} {n}" for b, n in table.columns]
    md = f"Peak memory ({key.removeprefix('memory/')}, GiB) of {args.recipe} on {device}, "
    md += f"{args.prompts} prompts/step\n\n| generations \\ baseline, max_tokens | " + " | ".join(table.columns)
    md += " |\n|---|" + "---|" * len(table.columns) + "\n"
    md += "".join(f"| {g} | " + " | ".join(f"{v:.3f}" for v in row) + " |\n" for g, row in table.iterrows())
    (args.out / "memory.md").write_text(md)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for (b, n), s in df.groupby(["baseline", "max_tokens"]):
        ax.plot(
            s.generations, s[key], marker="o", label=f"{'RLOO' if b == 'leave_one_out' else 'GRPO'}, max_tokens {n}"
        )
    ax.set(
        xlabel="generations per prompt", ylabel=f"{key.removeprefix('memory/')} (GiB)", xscale="log", xticks=GENERATIONS
    )
    ax.set_xticklabels([str(g) for g in GENERATIONS])
    ax.set_title(f"{args.recipe} on {device}: peak memory")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "memory.png", dpi=120)
    print("\n" + md + f"\n→ {args.out}/memory.csv, memory.md, memory.png")


if __name__ == "__main__":
    main()

"""``make bench-memory``: peak memory by phase as generations per prompt and completion length grow.

Each setting is a short real run of one recipe (``length.control=none`` so the completion budget is
exact, micro-batch = all rollouts so training activations grow with them) in its own process, so
peaks do not leak between settings. On a GPU the numbers are CUDA peak allocated memory per phase;
on CPU, the process's resident memory at the end of each phase and its lifetime peak.
``--baseline both`` repeats the sweep with RLOO's leave-one-out baseline beside GRPO's group mean
(seed 004's k = 2, 4, 8 generations per prompt sweep). ``--finetune full lora qlora`` repeats it
for full fine-tuning, LoRA adapters and QLoRA (4-bit weights, CUDA only) and adds tokens/s (prompt +
completion tokens per second of a training step, and of its generation phase, from the last step).
``--model PATH`` runs a local checkpoint; ``--random-model LAYERSxHIDDEN`` builds an untrained Llama
of that shape with the project's tokenizer (memory and speed do not depend on what it has learnt).
Writes artifacts/bench-memory/{memory.csv, memory.md, memory.png}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch

GENERATIONS = (2, 4, 8, 16)
LENGTHS = (32, 64, 128)
FINETUNE = {  # recipe overrides of each fine-tuning mode
    "full": {},
    "lora": {"model.lora": {"r": 16}},
    "qlora": {"model.lora": {"r": 16}, "model.quantization": "4bit"},
}


def random_model(shape: str, out: Path, device: str = "cpu") -> Path:
    """An untrained Llama of ``LAYERSxHIDDEN`` (heads of 64, MLP 2.75 x hidden, as Llama's) with the
    project's tokenizer, saved once under ``out``; its random weights are drawn on ``device``
    (``cuda``: seconds where a CPU takes minutes for billions of parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from runners.task.tokenizer import build_tokenizer

    layers, hidden = (int(x) for x in shape.lower().split("x"))
    path = out / f"random-llama-{layers}x{hidden}"
    if (path / "config.json").is_file():
        return path
    tok = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        intermediate_size=int(hidden * 2.75) // 64 * 64,
        max_position_embeddings=1024,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(path)
    print(f"built {path.name}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters", flush=True)
    return path


def one(
    recipe: str,
    generations: int,
    length: int,
    prompts: int,
    run_dir: Path,
    baseline: str = "group_mean",
    finetune: str = "full",
    model: Path | None = None,
) -> dict[str, float]:
    from runners.recipe import load_recipe
    from runners.rl.train import train

    where = {"model.path": str(model), "model.size": None} if model else {}
    r = load_recipe(
        recipe,
        {
            **where,
            **FINETUNE[finetune],
            "batch.generations": generations,
            "batch.prompts": prompts,
            "batch.micro_batch": prompts * generations,
            "length.control": "none",
            "length.max_tokens": length,
            "algorithm.off_policy": "pipeline",
            "algorithm.pipeline_lag": 0,
            "algorithm.advantage_baseline": baseline,
            "train.steps": 3,
            "train.save_every": 100,
            "eval.every": 3,  # at step 0 and the end only
            "eval.prompts": 16,
            "eval.batch_prompts": 16,
        },
    )
    peaks: dict[str, float] = {}
    steps: dict[int, dict[str, float]] = {}

    def sink(metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            k = k.removeprefix("train/")
            if "memory/" in k:
                peaks[k] = max(peaks.get(k, 0.0), v)
            elif k.startswith("time/") or k == "num_tokens":  # TRL's cumulative prompt + completion tokens
                steps.setdefault(step, {})[k] = v

    train(r, run_dir, sinks=[sink], log=lambda m: None)
    timed = [s for _, s in sorted(steps.items()) if "num_tokens" in s and "time/update_seconds" in s]
    if len(timed) >= 2:  # the last step: warm (the first compiles kernels, fills caches)
        last, before = timed[-1], timed[-2]
        tokens = last["num_tokens"] - before["num_tokens"]
        phases = sum(last.get(f"time/{ph}_seconds", 0.0) for ph in ("generation", "reward", "update"))
        peaks["speed/step_tokens_per_s"] = tokens / phases if phases else float("nan")
        gen = last.get("time/generation_seconds", 0.0)
        peaks["speed/generation_tokens_per_s"] = tokens / gen if gen else float("nan")
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
    p.add_argument(
        "--generations", type=int, nargs="+", default=list(GENERATIONS), help=f"generations per prompt {GENERATIONS}"
    )
    p.add_argument(
        "--finetune", nargs="+", choices=list(FINETUNE), default=["full"], help="fine-tuning modes (default full)"
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--model", type=Path, help="a local Hugging Face checkpoint instead of the embedded model")
    where.add_argument(
        "--random-model", metavar="LAYERSxHIDDEN", help="an untrained Llama of this shape, e.g. 16x2048 (~0.8B)"
    )
    p.add_argument("--one", nargs=2, type=int, metavar=("GENERATIONS", "LENGTH"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if "qlora" in args.finetune and not torch.cuda.is_available():
        raise SystemExit("--finetune qlora: bitsandbytes' 4-bit weights need a CUDA GPU; this machine has none")
    if args.model is not None and not (args.model / "config.json").is_file():
        raise SystemExit(f"--model {args.model}: not a Hugging Face checkpoint folder (no config.json)")
    if args.one:
        g, n = args.one
        (ft,) = args.finetune
        run_dir = args.out / "runs" / f"{ft}-{args.baseline}-g{g}-l{n}"
        shutil.rmtree(run_dir, ignore_errors=True)  # measure a fresh run, never resume an earlier one
        peaks = one(args.recipe, g, n, args.prompts, run_dir, args.baseline, ft, args.model)
        shutil.rmtree(run_dir, ignore_errors=True)  # a large model's checkpoints take GBs per setting
        print(json.dumps(peaks))
        return
    baselines = ["group_mean", "leave_one_out"] if args.baseline == "both" else [args.baseline]

    args.out.mkdir(parents=True, exist_ok=True)
    model = random_model(args.random_model, args.out) if args.random_model else args.model
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    subject = f"{args.recipe}" + (f" with model {model.name}" if model else "")
    print(
        f"peak memory of {subject} on {device}: {args.finetune} x generations {args.generations}"
        f" x lengths {args.lengths}",
        flush=True,
    )
    rows = []
    grid = [(f, b, n, g) for f in args.finetune for b in baselines for n in args.lengths for g in args.generations]
    for f, b, n, g in grid:
        cmd = [sys.executable, "-m", "tests.bench_memory", args.recipe, "--prompts", str(args.prompts)]
        cmd += ["--out", str(args.out), "--baseline", b, "--finetune", f, "--one", str(g), str(n)]
        cmd += ["--model", str(model)] if model else []
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"{f}, {b}, generations {g}, length {n} failed:\n{res.stderr[-2000:]}")
        peaks = json.loads(res.stdout.strip().splitlines()[-1])
        rows.append(
            {"finetune": f, "baseline": b, "generations": g, "max_tokens": n, "rollouts": g * args.prompts, **peaks}
        )
        shown = "  ".join(
            f"{k.split('/')[-1]} {v:.3f}" for k, v in sorted(peaks.items()) if "peak" in k or "update_" in k
        )
        shown += "".join(f"  {k.split('/')[-1]} {v:,.0f}" for k, v in sorted(peaks.items()) if k.startswith("speed/"))
        print(f"  {f:<5}  {b:<13}  generations {g:>2}  max_tokens {n:>3}  {shown}", flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(args.out / "memory.csv", index=False)
    key = "memory/update_allocated_gb" if torch.cuda.is_available() else "memory/host_peak_rss_gb"
    (args.out / "memory.md").write_text(summary(df, key, f"{subject} on {device}, {args.prompts} prompts/step"))
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for (f, b, n), s in df.groupby(["finetune", "baseline", "max_tokens"]):
        name = f"{'RLOO' if b == 'leave_one_out' else 'GRPO'}, max_tokens {n}" + (f", {f}" if f != "full" else "")
        ax.plot(s.generations, s[key], marker="o", label=name)
    ax.set(
        xlabel="generations per prompt",
        ylabel=f"{key.removeprefix('memory/')} (GiB)",
        xscale="log",
        xticks=args.generations,
    )
    ax.set_xticklabels([str(g) for g in args.generations])
    ax.set_title(f"{subject} on {device}: peak memory", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "memory.png", dpi=120)
    print("\n" + (args.out / "memory.md").read_text() + f"\n→ {args.out}/memory.csv, memory.md, memory.png")


def summary(df: pd.DataFrame, key: str, subject: str) -> str:
    """Markdown: the peak-memory table (generations x baseline, length, mode) and, where measured,
    each setting's peaks by phase and tokens/s."""
    table = df.pivot(index="generations", columns=["finetune", "baseline", "max_tokens"], values=key)
    table.columns = [
        f"{'RLOO' if b == 'leave_one_out' else 'GRPO'} {n}" + (f" {f}" if f != "full" else "")
        for f, b, n in table.columns
    ]
    md = f"Peak memory ({key.removeprefix('memory/')}, GiB) of {subject}\n\n"
    md += "| generations \\ baseline, max_tokens | " + " | ".join(table.columns) + " |\n"
    md += "|---|" + "---|" * len(table.columns) + "\n"
    md += "".join(f"| {g} | " + " | ".join(f"{v:.3f}" for v in row) + " |\n" for g, row in table.iterrows())
    phases = [c for c in df.columns if c.endswith("_allocated_gb") and c != "memory/peak_allocated_gb"]
    speed = [c for c in ("speed/step_tokens_per_s", "speed/generation_tokens_per_s") if c in df.columns]
    if phases or speed:
        cols = [c.removeprefix("memory/").removesuffix("_allocated_gb") + " GiB" for c in phases]
        cols += [c.removeprefix("speed/").replace("_tokens_per_s", " tokens/s") for c in speed]
        md += "\nBy phase (peak allocated) and speed (prompt + completion tokens per second, last step)\n\n"
        md += "| mode | baseline | generations | max_tokens | " + " | ".join(cols) + " |\n"
        md += "|---|---|---|---|" + "---|" * len(cols) + "\n"
        for _, r in df.iterrows():
            vals = [f"{r[c]:.3f}" for c in phases] + [f"{r[c]:,.0f}" for c in speed]
            md += f"| {r.finetune} | {r.baseline} | {r.generations} | {r.max_tokens} | " + " | ".join(vals) + " |\n"
    return md


if __name__ == "__main__":
    main()

"""``make bench-build``: are two builds of one base-model key the same weights, and at what cost?

Builds a recipe's embedded base model ``--builds`` times with PyTorch's deterministic algorithms
(the default, ``runners.task.basemodel.deterministic_algorithms``) and as many times without, each in
its own process and its own empty cache folder, one after another on the first device; prints each
build's weight hash (``weights_sha256``) and time, whether the builds of a mode are bit-identical, and
the deterministic mode's cost in time. A build that fails (an operation with no deterministic kernel)
prints its error's last line, which names the operation. ``--out DIR`` also writes ``builds.csv``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd


def one(recipe_name: str, size: str | None, cache: Path, deterministic: bool) -> dict:
    """One build into ``cache`` (in this process): its hash, times and device."""
    from runners.recipe import load_recipe
    from runners.task.basemodel import ensure_base_model

    recipe = load_recipe(recipe_name, {"model.size": size} if size else None)
    t0 = time.perf_counter()
    path = ensure_base_model(
        recipe.model.size,
        recipe.data.task,
        cache,
        build_seed=recipe.model.build_seed,
        deterministic=deterministic,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    info = json.loads((path / "build_info.json").read_text())
    return {
        "size": info["size"],
        "key": info["key"],
        "deterministic": deterministic,
        "weights": info["weights_sha256"],
        "seconds": time.perf_counter() - t0,
        "sft_seconds": info["sft_seconds"],
        "mean_at_16": info["val"]["mean_at_k"],
        "device": info["device"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="scalerl", help="recipe whose model.size is built (default: scalerl)")
    ap.add_argument("--size", help="build this embedded size instead of the recipe's (e.g. micro)")
    ap.add_argument("--builds", type=int, default=2, help="builds per mode (default 2)")
    ap.add_argument("--modes", default="deterministic,default", help="deterministic, default, or both (the default)")
    ap.add_argument("--out", type=Path, help="folder for builds.csv")
    ap.add_argument("--one", nargs=2, metavar=("CACHE", "DETERMINISTIC"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.recipe, args.size, Path(args.one[0]), args.one[1] == "1")))
        return 0
    modes = [m.strip() for m in args.modes.split(",")]
    if bad := [m for m in modes if m not in ("deterministic", "default")]:
        ap.error(f"--modes {bad[0]!r}: choose deterministic, default or both (deterministic,default)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
        for mode in modes:
            for i in range(args.builds):
                cache = Path(tmp) / f"{mode}-{i}"
                flag = "1" if mode == "deterministic" else "0"
                cmd = [sys.executable, "-m", "tests.bench_build", "--recipe", args.recipe, "--one", str(cache), flag]
                cmd += ["--size", args.size] if args.size else []
                print(f"build {i + 1}/{args.builds}, {mode} ...", flush=True)
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    why = (done.stderr.strip().splitlines() or ["no output"])[-1]
                    print(f"  failed: {why}", flush=True)
                    rows.append({"mode": mode, "build": i, "error": why})
                    continue
                row = {"mode": mode, "build": i, **json.loads(done.stdout.strip().splitlines()[-1])}
                print(f"  weights {row['weights'][:16]}  {row['seconds']:.0f} s (SFT {row['sft_seconds']:.0f} s)")
                rows.append(row)
    df = pd.DataFrame(rows)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.out / "builds.csv", index=False)
    print()
    for mode, g in df.groupby("mode", sort=False):
        ok = g.dropna(subset=["weights"]) if "weights" in g else g.iloc[0:0]
        hashes = ok["weights"].unique() if len(ok) else []
        same = "bit-identical" if len(ok) == len(g) and len(hashes) == 1 else f"{len(hashes)} distinct weights"
        time_s = f"median {ok['seconds'].median():.0f} s, SFT {ok['sft_seconds'].median():.0f} s" if len(ok) else ""
        print(f"{mode:>13}: {len(ok)}/{len(g)} builds, {same}; {time_s}")
    if {"deterministic", "default"} <= set(df["mode"]) and "sft_seconds" in df:
        sft = df.groupby("mode")["sft_seconds"].median()
        print(f"deterministic SFT costs {sft['deterministic'] / sft['default']:.2f}x the default's time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

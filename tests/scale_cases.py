"""Large synthetic curve files and a measured command run, shared by the scale tests and ``make bench-fit``."""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import pandas as pd

from scalefit.data.synthetic import TABLE1, synthetic_curve


def seeds_csv(path: Path, seeds: int, n: int, n_prompts: int = 50) -> Path:
    """``seeds`` runs of the ScaleRL Table 1 curve to 16k GPU-hours, ``n`` evaluations each (mean@16
    over ``n_prompts`` prompts), as a CSV with columns seed, gpu_hours, mean_at_16."""
    cm, b, a = TABLE1["ScaleRL"]
    frames = []
    for s in range(seeds):
        c, v = synthetic_curve(cm, b, a, c_max=16_000.0, n_points=n, n_prompts=n_prompts, seed=s)
        frames.append(pd.DataFrame({"seed": s, "gpu_hours": c, "mean_at_16": v}))
    pd.concat(frames).to_csv(path, index=False)
    return path


def run_measured(cmd: list[str], cwd: Path, limit: int | None = None) -> tuple[int, str, str, int]:
    """Run ``cmd`` (BLAS on one thread); its exit code, stdout, stderr and peak resident memory in
    bytes (its own, from ``wait4``), under an address-space ``limit`` if given."""
    out, err = cwd / "stdout.txt", cwd / "stderr.txt"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def cap() -> None:
        if limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with out.open("w") as o, err.open("w") as e:
        p = subprocess.Popen(cmd, stdout=o, stderr=e, env=env, preexec_fn=cap)
        _, status, usage = os.wait4(p.pid, 0)
    return os.waitstatus_to_exitcode(status), out.read_text(), err.read_text(), usage.ru_maxrss * 1024


def size_curves(df: pd.DataFrame) -> pd.DataFrame:
    """A synthetic scale study's runs (``scalefit.data.synthetic.size_runs``) as ``analysis fit`` reads a
    scale campaign's curves: a variant per size, a step per 512 completions."""
    variant = "size=" + df["size"]
    return pd.DataFrame(
        {
            "run": variant + "/seed" + df["seed"].astype(str),
            "variant": variant,
            "axis": "size",
            "seed": df["seed"],
            "step": (df["compute"] / 512).round().astype(int),
            "val/mean_at_16": df["value"],
            "compute/samples": df["compute"],
        }
    )

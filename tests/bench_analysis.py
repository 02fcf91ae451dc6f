"""``make bench-analysis``: the time of ``python -m analysis fit`` on a recorded campaign's curves.

Runs ``python -m analysis fit CAMPAIGN --curves results/CAMPAIGN/curves.csv`` (default loo-gpu6: 28
runs, 6 variants; the joint fit, its bootstrap, the backtests, the half-budget check, the table, the
plot) as a user does, each in a fresh process, once untimed (it writes the bytecode a fresh checkout's
first command writes) and then ``--runs`` times (default 3). Prints each run's wall time and CPU time
(user + system, of the process and its children), their medians, the machine's cores and its load
before and after (the CPU is shared: wall time grows with the load, CPU time much less), and whether
every run wrote the same files byte for byte. Issue 61's target: <= 10 s on 2 cores.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUTS = ("loo_table.csv", "loo_table.md", "extrapolation.csv", "loo_curves.png")
TARGET_S = 10.0


def fit_once(campaign: str, curves: Path, out: Path, env: dict[str, str]) -> tuple[float, float]:
    """One ``analysis fit`` in a fresh process: its wall time and CPU time (user + system), in seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "analysis", "fit", campaign, "--curves", str(curves), "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"error: `{' '.join(cmd)}` exited {done.returncode}:\n{done.stderr.strip()}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--campaign", default="loo-gpu6", help="a campaign with results/CAMPAIGN/curves.csv")
    ap.add_argument("--runs", type=int, default=3, help="timed runs (the median is reported)")
    args = ap.parse_args(argv)
    curves = ROOT / "results" / args.campaign / "curves.csv"
    if not curves.is_file():
        print(f"error: {curves} not found; pass --campaign with a recorded campaign (ls results/)", file=sys.stderr)
        return 2
    if args.runs < 1:
        print(f"error: --runs {args.runs}: at least 1", file=sys.stderr)
        return 2
    # as make runs it: bytecode written (PYTHONDONTWRITEBYTECODE would recompile every import, ~7 s a
    # run: the Makefile unexports it), plots to files
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.setdefault("MPLBACKEND", "Agg")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-analysis-") as tmp:
        fit_once(args.campaign, curves, Path(tmp) / "warm", env)
        walls, cpus = [], []
        for i in range(args.runs):
            wall, cpu = fit_once(args.campaign, curves, Path(tmp) / f"run{i}", env)
            walls.append(wall)
            cpus.append(cpu)
            print(f"run {i + 1}: wall {wall:.2f} s, CPU {cpu:.2f} s", flush=True)
        same = all(
            filecmp.cmp(Path(tmp) / "run0" / name, Path(tmp) / f"run{i}" / name, shallow=False)
            for i in range(1, args.runs)
            for name in OUTPUTS
        )
    load_after = os.getloadavg()
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    print(
        f"analysis fit {args.campaign} --curves {curves.relative_to(ROOT)}: median of {args.runs}: wall {wall:.2f} s,"
        f" CPU {cpu:.2f} s (target <= {TARGET_S:g} s: {'met' if wall <= TARGET_S else 'not met'} in wall time,"
        f" {'met' if cpu <= TARGET_S else 'not met'} in CPU time)"
    )
    print(
        f"machine: {os.cpu_count()} cores, load {load_before[0]:.2f} before and {load_after[0]:.2f} after (1-min"
        f" average); outputs {'identical' if same else 'DIFFERENT'} across the runs ({', '.join(OUTPUTS)})"
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())

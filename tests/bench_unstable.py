"""The unstable-run flag's false-flag rate and power (part of ``make bench-predict``).

Simulated healthy campaigns with known truth: 4-10 arms, the baseline on 3, 4 or 8 seeds and the
other arms on 2-4, 13-41 evaluations on a rising, saturating curve. Each arm has its own seed spread
(its sd drawn log-uniformly over a 4x range around the campaign's, 0.006-0.016: the
recorded arms' robust seed sd runs 0.007-0.025), growing with compute (x2.5 from
the first evaluation to the last, as the recorded studies' seed sd grows ~1.6x from half to full),
made of a seed offset, an AR(1) drift (lag-1 correlation 0.5-0.95) and evaluation noise; the noise
is Gaussian ("light") or Student-t with 3 degrees of freedom scaled to the same sd ("heavy").
Reported: the share of studies with any run flagged (target <= 3%), then the planted departures:
an upward drift of one seed (its evaluations above its siblings: never to be flagged), a single
moderate dip (4 sd, not flagged),
a collapse (0.3 for 3 evaluations, a persistent 0.1 for 4) and a single large drop (0.2), each
planted in one seed of one arm, and how often each is flagged; and every recorded study's flags.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from scalefit.data.unstable import deviations, flag_runs, flagged, typical_scale

KNOWN = {("loo-gpu", "off_policy=ppo", 1), ("scale-gpu2-probe", "size=medium", 42)}  # the recorded collapses


def healthy_campaign(rng: np.random.Generator, tails: str) -> list[np.ndarray]:
    """One simulated campaign's arms, each a runs x evaluations matrix of a healthy recipe's seeds."""
    n_eval = int(rng.choice([13, 21, 31, 41]))
    t = np.linspace(0.0, 1.0, n_eval)
    sigma0 = float(rng.uniform(0.006, 0.016))
    arms = []
    for a in range(int(rng.integers(4, 11))):
        seeds = int(rng.choice([3, 4, 8])) if a == 0 else int(rng.choice([2, 3, 4]))
        top = float(rng.uniform(0.5, 0.9))
        curve = 0.47 + (top - 0.47) * (1 - np.exp(-t / rng.uniform(0.15, 0.6)))
        sd = sigma0 * float(np.exp(rng.uniform(np.log(0.5), np.log(2.0)))) * (0.6 + 0.9 * t)  # grows x2.5
        phi = float(rng.uniform(0.5, 0.95))

        def noise(shape: tuple[int, ...]) -> np.ndarray:
            if tails == "light":
                return rng.normal(size=shape)
            return rng.standard_t(3, size=shape) / np.sqrt(3.0)  # unit variance

        drift = np.zeros((seeds, n_eval))
        e = noise((seeds, n_eval)) * np.sqrt(1 - phi**2)
        drift[:, 0] = noise((seeds,))
        for j in range(1, n_eval):
            drift[:, j] = phi * drift[:, j - 1] + e[:, j]
        dev = 0.3 * noise((seeds, 1)) + 0.6 * drift + 0.7 * noise((seeds, n_eval))
        values = curve[None, :] + sd[None, :] * dev
        values[:, 0] = curve[0]  # every seed starts from the same base model
        arms.append(values)
    return arms


def _any_flag(arms: list[np.ndarray]) -> bool:
    typical = typical_scale(arms)
    return any(flagged(m, typical).any() for m in arms)


def _planted(arms: list[np.ndarray], rng: np.random.Generator, kind: str) -> tuple[bool, bool]:
    """(the planted seed flagged, any other run flagged) after planting ``kind`` in one seed."""
    arms = [m.copy() for m in arms]
    a = int(rng.integers(len(arms)))
    m, n = arms[a], arms[a].shape[1]
    i = int(rng.integers(len(m)))
    j = int(rng.integers(n // 2, n - 3))
    sd = float(np.std(m[:, -1] - np.median(m[:, -1])) or 0.01)
    if kind == "upward drift (+0.05 to +0.3, to the end)":
        m[i, j:] += np.linspace(0, float(rng.uniform(0.05, 0.3)), n - j)
    elif kind == "single dip of 4 sd":
        m[i, j] -= 4 * sd
    elif kind == "collapse 0.3 for 3 evaluations":
        m[i, j : j + 3] -= 0.3
    elif kind == "persistent 0.1 for 4 evaluations":
        m[i, j : j + 4] -= 0.1
    elif kind == "single drop of 0.2":
        m[i, j] -= 0.2
    typical = typical_scale(arms)
    hits = [flagged(x, typical) for x in arms]
    if kind.startswith("upward"):  # dropped where it stood above its siblings: never, by the rule
        above = np.nan_to_num(deviations(m)[i], nan=0.0) > 0
        return bool((hits[a][i] & above).any()), False
    mine = bool(hits[a][i].any())
    hits[a][i] = False
    return mine, any(h.any() for h in hits)


PLANTS = (
    "upward drift (+0.05 to +0.3, to the end)",
    "single dip of 4 sd",
    "collapse 0.3 for 3 evaluations",
    "persistent 0.1 for 4 evaluations",
    "single drop of 0.2",
)


def recorded(results: Path) -> list[str]:
    """Every recorded study's flags, the known collapses marked."""
    lines = []
    for csv in sorted(results.glob("*/curves*.csv")):
        df = pd.read_csv(csv)
        if not {"variant", "seed", "step", "val/mean_at_16"} <= set(df.columns):
            continue
        for f in flag_runs(df, "val/mean_at_16"):
            known = (csv.parent.name, f.variant, f.seed) in KNOWN
            lines.append(f"  {csv.parent.name}/{csv.name}: {f.text()}" + (" [known collapse]" if known else ""))
    found = {(ln.split("/")[0].strip(), *ln.split(": ", 1)[1].split(" seed ")[:1]) for ln in lines}
    missed = [k for k in KNOWN if (k[0], k[1]) not in found]
    lines.append(f"  known collapses flagged: {len(KNOWN) - len(missed)}/{len(KNOWN)}")
    return lines


def run(studies: int = 1000, seed: int = 0, results: Path = Path("results")) -> list[str]:
    """The benchmark's printed lines."""
    t0 = time.perf_counter()
    out = [
        "unstable-run flag (scalefit.data.unstable) on simulated healthy campaigns (target: <= 3% of studies flagged):"
    ]
    for tails in ("light", "heavy"):
        rng = np.random.default_rng(seed)
        flagged_studies = sum(_any_flag(healthy_campaign(rng, tails)) for _ in range(studies))
        out.append(
            f"  {tails} tails ({'Gaussian' if tails == 'light' else 'Student-t, 3 dof'}): "
            f"{flagged_studies}/{studies} studies flagged ({flagged_studies / studies:.1%})"
        )
    out.append("planted in one seed of one arm of a healthy campaign (light / heavy tails): that seed flagged")
    n = max(studies // 5, 50)
    for kind in PLANTS:
        cells = []
        for tails in ("light", "heavy"):
            rng = np.random.default_rng(seed + 1)
            res = [_planted(healthy_campaign(rng, tails), rng, kind) for _ in range(n)]
            cells.append(f"{sum(r[0] for r in res)}/{n}")
        out.append(f"  {kind}: {' / '.join(cells)}")
    out.append("recorded studies (results/*/curves*.csv), every flag:")
    out += recorded(results)
    out.append(f"unstable flag: {time.perf_counter() - t0:.0f} s")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--studies", type=int, default=1000, help="simulated campaigns per tail (default 1000)")
    p.add_argument("--results", default="results")
    args = p.parse_args(argv)
    print("\n".join(run(args.studies, results=Path(args.results))))


if __name__ == "__main__":
    main()

"""Compare two recipes with the paper's rule (§2.1).

If the asymptotes lie within the margin (default ±0.02, the run-to-run spread of A),
both curves are refitted with their mean A and compared on B (compute efficiency);
otherwise the higher A wins.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from scalefit.fit import SigmoidFit


@dataclass
class Comparison:
    baseline: str
    candidate: str
    A_baseline: float
    A_candidate: float
    rule: str  # "A" (asymptotes differ) or "B" (same asymptote, compare efficiency)
    winner: str  # baseline, candidate or tie
    B_baseline: float
    B_candidate: float
    shared_A: float | None
    verdict: str

    def to_dict(self) -> dict:
        return asdict(self)


def compare_fits(
    baseline: SigmoidFit,
    candidate: SigmoidFit,
    *,
    margin: float = 0.02,
    names: tuple[str, str] = ("baseline", "candidate"),
    b_tolerance: float = 1e-3,
) -> Comparison:
    """Apply the paper's comparison rule and return the verdict with its numbers."""
    nb, nc = names
    a1, a2 = baseline.A, candidate.A
    if abs(a1 - a2) > margin:
        winner = nb if a1 > a2 else nc
        verdict = (
            f"{winner} has the higher asymptote: A {a1:.3f} ({nb}) vs {a2:.3f} ({nc}), "
            f"|ΔA| = {abs(a1 - a2):.3f} > {margin}"
        )
        return Comparison(nb, nc, a1, a2, "A", winner, baseline.B, candidate.B, None, verdict)
    shared = float(np.mean([a1, a2]))
    f1, f2 = baseline.refit(a_grid=[shared]), candidate.refit(a_grid=[shared])
    if abs(f1.B - f2.B) <= b_tolerance:
        winner, how = "tie", "equally compute-efficient"
    else:
        winner = nb if f1.B > f2.B else nc
        how = f"{winner} is more compute-efficient"
    verdict = (
        f"same asymptote within ±{margin} (A {a1:.3f} vs {a2:.3f}); refitted at shared A = {shared:.4f}: "
        f"B {f1.B:.2f} ({nb}) vs {f2.B:.2f} ({nc}) → {how}"
    )
    return Comparison(nb, nc, a1, a2, "B", winner, f1.B, f2.B, shared, verdict)

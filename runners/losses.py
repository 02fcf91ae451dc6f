"""The policy losses a recipe may name (``algorithm.loss``): one row each, saying how TRL runs it and
which recipe setting holds its clip. ``runners.recipe`` takes the allowed names and the clip checks
from here, ``runners.rl.plan.trl_args`` the TRL arguments. Imports nothing (recipes load without torch).

A new loss is a row here; a clip of its own is a field of ``AlgorithmConfig`` that the row names, and
maths TRL lacks goes into ``runners.rl.trainer``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Loss:
    """How one loss runs: TRL's ``loss_type`` and ``importance_sampling_level``, and its clip.

    ``epsilon_field`` names the ``AlgorithmConfig`` field holding the clip: a pair (epsilon,
    epsilon_high), or, when ``fixed_epsilon`` is set, epsilon_high alone (TRL's ``epsilon`` is then
    ``fixed_epsilon``, which the loss does not use)."""

    trl_loss_type: str
    importance_sampling_level: Literal["token", "sequence"]
    epsilon_field: str
    fixed_epsilon: float | None = None
    typical: str = ""  # the clip's usual values, for error messages

    def trl_epsilons(self, clip: float | tuple[float, float]) -> tuple[float, float]:
        """TRL's (epsilon, epsilon_high) from the value of ``epsilon_field``."""
        if self.fixed_epsilon is not None:
            return self.fixed_epsilon, clip
        low, high = clip
        return low, high

    def clip_problem(self, clip: float | tuple[float, float]) -> str | None:
        """What is wrong with a value of ``epsilon_field`` (None: nothing), and the fix."""
        hint = f" ({self.typical})" if self.typical else ""
        if self.fixed_epsilon is not None:
            return None if clip > 0 else f"must be > 0{hint}"
        low, high = clip
        return None if 0 < low < 1 and high > 0 else f"need 0 < low < 1 and high > 0{hint}"


LOSSES: dict[str, Loss] = {
    # CISPO: truncated importance weights, no clipping of the update; TRL reads only epsilon_high (ε_max)
    "cispo": Loss("cispo", "token", "cispo_epsilon_max", fixed_epsilon=0.2, typical="paper: 4-8"),
    # DAPO: PPO's clipped ratio with a higher upper clip, token-level normaliser
    "dapo": Loss("dapo", "token", "dapo_epsilon"),
    # GSPO: the clipped ratio of whole sequences (geometric mean of token ratios), DAPO's normaliser
    "gspo": Loss("dapo", "sequence", "gspo_epsilon"),
}

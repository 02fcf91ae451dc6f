"""DAPO: PPO's clipped token ratio with a higher upper clip, over TRL's token-sum normaliser."""

from __future__ import annotations

from runners.losses import Loss, Setting, clip_pair, register

LOSS = register(
    Loss(
        name="dapo",
        trl_loss_type="dapo",
        importance_sampling_level="token",
        normaliser="token_sum",
        settings=(Setting("dapo_epsilon", (0.2, 0.28), clip_pair(), "the clip (low, high)"),),
        trl=lambda dapo_epsilon: {"epsilon": dapo_epsilon[0], "epsilon_high": dapo_epsilon[1]},
        note="the token ratio clipped to [1 - low, 1 + high]",
    )
)

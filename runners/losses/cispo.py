"""CISPO (MiniMax-M1; ScaleRL's loss): truncated importance weights, no clipping of the update.

TRL reads only ``epsilon_high`` (ε_max); its ``epsilon`` is unused and fixed at TRL's default."""

from __future__ import annotations

from runners.losses import Loss, Setting, positive, register

LOSS = register(
    Loss(
        name="cispo",
        trl_loss_type="cispo",
        importance_sampling_level="token",
        normaliser="token_sum",
        settings=(Setting("cispo_epsilon_max", 5.0, positive("paper: 4-8"), "ε_max, the importance weight's cap"),),
        trl=lambda cispo_epsilon_max: {"epsilon": 0.2, "epsilon_high": cispo_epsilon_max},
        note="truncated importance weights, capped at ε_max",
    )
)

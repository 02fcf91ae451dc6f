"""GSPO: the clipped ratio of whole sequences (geometric mean of token ratios), with DAPO's
token-sum normaliser (TRL's ``dapo`` loss at ``importance_sampling_level: sequence``)."""

from __future__ import annotations

from runners.losses import Loss, Setting, clip_pair, register

LOSS = register(
    Loss(
        name="gspo",
        trl_loss_type="dapo",
        importance_sampling_level="sequence",
        normaliser="token_sum",
        settings=(Setting("gspo_epsilon", (3e-3, 4e-3), clip_pair(), "the sequence ratio's clip (low, high)"),),
        trl=lambda gspo_epsilon: {"epsilon": gspo_epsilon[0], "epsilon_high": gspo_epsilon[1]},
        note="the sequence ratio clipped to [1 - low, 1 + high]",
    )
)

"""SAPO (Soft Adaptive Policy Optimization, arXiv 2511.20347): no clip, a soft gate on the token ratio r,
sigmoid(τ (r − 1)) · 4/τ, with one temperature τ for positive advantages and one for the others.

TRL's ``sapo`` loss divides each completion's token sum by its own length and averages over the
completions (``sequence_mean``), unlike CISPO/DAPO's token sum: ``algorithm.aggregation`` weighs for it."""

from __future__ import annotations

from runners.losses import Loss, Setting, positive, register

TYPICAL = "paper: 1.0 for positive and 1.05 for negative advantages"

LOSS = register(
    Loss(
        name="sapo",
        trl_loss_type="sapo",
        importance_sampling_level="token",
        normaliser="sequence_mean",
        settings=(
            Setting("sapo_temperature_pos", 1.0, positive(TYPICAL), "τ for tokens of positive advantage"),
            Setting("sapo_temperature_neg", 1.05, positive(TYPICAL), "τ for the others"),
        ),
        trl=lambda sapo_temperature_pos, sapo_temperature_neg: {
            "sapo_temperature_pos": sapo_temperature_pos,
            "sapo_temperature_neg": sapo_temperature_neg,
        },
        note="no clip: a soft gate on the ratio, whose temperatures are its settings",
    )
)

"""The RL core: ``ScaleRLTrainer`` (TRL's ``GRPOTrainer`` with every ScaleRL axis), its prompt
sampler, rewards and mean@16 evaluation, the recipe→TRL mapping (``plan``), the memory estimate,
phase profiling, and ``train`` (one run from a recipe, resumable)."""

"""The RL core: ``ScaleRLTrainer`` (TRL's ``GRPOTrainer`` with every ScaleRL axis), its prompt
sampler, sharding, the recipe→TRL mapping (``plan``), the memory estimate, phase profiling, and
``train`` (one run from a recipe, resumable)."""

"""RL runs on TRL and campaigns of them: what produces the runs that ``analysis`` reads.

- ``recipe``: the typed recipe (YAML → dataclasses, errors that name the fix), shared by all below;
  ``losses``: the losses it may name, one row each (TRL's loss type, its clip);
- ``rl/``: the RL core — the trainer (``ScaleRLTrainer`` on TRL's ``GRPOTrainer``), its sampling,
  sharding, the one recipe→TRL mapping (``plan``), memory estimate, and ``train``;
- ``task/``: the embedded world a laptop runs offline — the arithmetic task, its tokenizer, the base
  model built from it, the datasets, the rewards and evaluation (imports no ``rl``, no ``recipe``);
- ``ops/``: operations — campaigns (schema, runs, the local and Ray schedulers, adaptive stops), the
  MLflow contract (``store``) and tracking, PostgreSQL, store transfer, offline wheels;
- ``cli``: ``python -m runners …``.
"""

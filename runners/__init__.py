"""RL runs on TRL and campaigns of them: what produces the runs that ``analysis`` reads.

- ``recipe``: the typed recipe (YAML → dataclasses, errors that name the fix), shared by all below;
  ``losses/``: the losses it may name, one module each (TRL's loss type, its settings, its normaliser);
- ``rl/``: the RL core — the trainer (``ScaleRLTrainer`` on TRL's ``GRPOTrainer``), its sampling,
  sharding, the one recipe→TRL mapping (``plan``), memory estimate, and ``train``;
- ``task/``: the embedded world a laptop runs offline — the arithmetic task, its tokenizer, the base
  model built from it, the datasets, the rewards and evaluation (imports no ``rl``, no ``recipe``);
- ``tracking/``: MLflow — the contract (``store``), a local server's life cycle, a tracked run, the
  shared server on PostgreSQL, store transfer;
- ``campaign/``: campaigns — spec, loading and expansion, runs, adaptive stops, the backends (local,
  Ray, SLURM) that run them;
- ``setup/``: installation — the pinned installs, wheels for offline machines;
- ``locks``: one writer at a time; ``parent_death``: children that die with their starter;
  ``permissions``: who may read what the project writes; ``launch``: one run from the command line
  (several processes through accelerate);
- ``cli``: ``python -m runners …``, its arguments (it calls into the modules above).
"""

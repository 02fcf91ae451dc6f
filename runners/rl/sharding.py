"""Sharded runs: what FSDP (versions 1 and 2, through accelerate) changes for a run.

- ``Layout``: how a run's state is spread over its processes (DDP replicas, or FSDP shards and
  which of them), read from accelerate's launch environment inside a run and from an accelerate
  config file for ``python -m runners plan``; ``runners.rl.memory`` says from it what each GPU holds.
- ``full_parameters``: the model to generate with, its parameters whole, entered as TRL's
  ``GRPOTrainer`` enters its own generation: ``unwrap_model_for_generation`` and, under FSDP 1,
  the root unit's parameters summoned (each decoder layer gathers its own in its forward); FSDP 2
  gathers through the ``generate`` that the Trainer registers as an FSDP forward method.
- ``save_full_model``: ``save_pretrained`` from the full state dict gathered from the shards
  (accelerate's ``get_state_dict``, a collective every process calls), written by the main process.

Under FSDP every forward gathers parameters from every process, so every process must make the
same number of ``generate`` calls (``runners.task.evaluation`` and the trainer's interruption
continuation see to it); within a call, transformers keeps the processes in step (``synced_gpus``).
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from runners.recipe import RecipeError

# accelerate's names for FSDP 1's strategies; FSDP 2's reshard_after_forward true/false maps to the first two
STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")


@dataclass(frozen=True)
class Layout:
    """A run's processes and how its parameters, gradients and optimizer state are split among them.

    ``fsdp`` is the FSDP version (None: DDP, or one process). ``strategy`` is FSDP 1's sharding
    strategy: FULL_SHARD splits everything and gathers one unit at a time; SHARD_GRAD_OP keeps a
    unit's gathered weights from its forward to its backward (the whole model at the peak);
    NO_SHARD is DDP. On one machine the hybrid strategies are the first two.
    """

    world: int = 1
    fsdp: int | None = None
    strategy: str = "FULL_SHARD"

    @property
    def shards_state(self) -> bool:
        """Weights, gradients and AdamW state are split over the processes."""
        return self.fsdp is not None and self.world > 1 and self.strategy != "NO_SHARD"

    @property
    def keeps_gathered_weights(self) -> bool:
        """Gathered weights stay from forward to backward (SHARD_GRAD_OP; FSDP 2 without reshard_after_forward)."""
        return self.strategy in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2")

    def describe(self) -> str:
        if self.world == 1:
            return "1 process"
        if self.fsdp is None:
            return f"DDP over {self.world} processes"
        return f"FSDP {self.fsdp} {self.strategy} over {self.world} processes"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Layout:
        """The layout ``accelerate launch`` started this process with (its WORLD_SIZE and FSDP_* variables)."""
        env = os.environ if env is None else env
        world = int(env.get("WORLD_SIZE", "1"))
        if env.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
            return cls(world)
        version = int(env.get("FSDP_VERSION", "1"))
        reshard = env.get("FSDP_RESHARD_AFTER_FORWARD", "true")
        return cls(world, version, _strategy(version, env.get("FSDP_SHARDING_STRATEGY"), reshard))

    @classmethod
    def from_config(cls, path: str | Path | None, world: int) -> Layout:
        """The layout an ``accelerate config`` file gives ``world`` processes (None: plain DDP)."""
        if path is None:
            return cls(world)
        p = Path(path)
        if not p.is_file():
            raise RecipeError(f"--accelerate-config {p}: no such file (examples: experiments/accelerate/fsdp1.yaml)")
        try:
            cfg = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise RecipeError(f"--accelerate-config {p}: not YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(cfg, dict):
            raise RecipeError(f"--accelerate-config {p}: expected a mapping of accelerate settings")
        if str(cfg.get("distributed_type", "")).upper() != "FSDP":
            return cls(world)
        fsdp = cfg.get("fsdp_config") or {}
        version = int(fsdp.get("fsdp_version", 1))
        reshard = fsdp.get("fsdp_reshard_after_forward", True)
        return cls(world, version, _strategy(version, fsdp.get("fsdp_sharding_strategy"), reshard))


def _strategy(version: int, strategy: str | None, reshard: str | bool) -> str:
    """FSDP 1 names its strategy (in ``sharding_strategy``, or in ``reshard_after_forward`` as TRL's
    example configs do); FSDP 2 has reshard_after_forward true (FULL_SHARD-like) or false (SHARD_GRAD_OP-like)."""
    text = str(reshard).upper()
    if version == 1:
        name = str(strategy).upper() if strategy else text if text in STRATEGIES else "FULL_SHARD"
        if name.isdigit():  # accelerate also takes 1-5 for the strategies, in this order
            name = STRATEGIES[int(name) - 1]
        if name not in STRATEGIES:
            raise RecipeError(f"FSDP sharding strategy {name!r} is not one of {', '.join(STRATEGIES)}")
        return name
    return "FULL_SHARD" if text in ("TRUE", "1", "FULL_SHARD") else "SHARD_GRAD_OP"


def is_sharded(accelerator) -> bool:
    """The accelerator runs FSDP (either version) over more than one process."""
    from trl.distributed import DistributedBackend  # noqa: PLC0415 - the backend TRL's trainers detect

    return accelerator is not None and accelerator.num_processes > 1 and DistributedBackend(accelerator).is_fsdp


@contextmanager
def full_parameters(trainer):
    """The trainer's model, ready to ``generate`` with whole parameters (TRL's own generation context).

    DDP or one process: the unwrapped model. FSDP 1: the unwrapped model with the root unit's
    parameters summoned; every decoder layer gathers its own in its forward. FSDP 2: the model,
    whose ``generate`` the Trainer registered as an FSDP forward. Gradient checkpointing is off inside.
    """
    from trl.distributed import DistributedBackend  # noqa: PLC0415
    from trl.models import unwrap_model_for_generation  # noqa: PLC0415

    args = trainer.args
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
        ) as model,
        DistributedBackend(trainer.accelerator).summon_full_params(trainer.model_wrapped, recurse=False),
    ):
        yield model


def save_full_model(trainer, out: Path, extra: dict[str, str] | None = None) -> None:
    """``save_pretrained`` of the trainer's model and tokenizer, plus ``extra`` files, into ``out``:
    written aside and moved into place. Every process must call it: under FSDP the full state dict
    is gathered from every shard; only the main process writes."""
    acc = trainer.accelerator
    state = acc.get_state_dict(trainer.model_wrapped) if is_sharded(acc) else None
    if not acc.is_main_process:
        return
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    acc.unwrap_model(trainer.model_wrapped).save_pretrained(str(tmp), state_dict=state)
    trainer.processing_class.save_pretrained(str(tmp))
    for name, text in (extra or {}).items():
        (tmp / name).write_text(text)
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)

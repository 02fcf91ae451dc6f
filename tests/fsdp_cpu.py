"""``python -m tests.fsdp_cpu ARGS``: ``python -m runners ARGS`` with accelerate's FSDP on CPU processes.

For the CPU tests of sharded runs (tests/test_fsdp.py), started by ``accelerate launch`` with an
FSDP version 2 config. accelerate turns FSDP on for accelerator devices only: on CPU processes it
keeps ``MULTI_CPU`` and runs the model unsharded. PyTorch's FSDP 2 (``fully_shard``) does run on
CPU over gloo, so this lifts that one decision and nothing else: the state says FSDP with the
launch's plugin (and its mixed precision policy, as on GPUs), and from there accelerate,
transformers, TRL and the runner take their real FSDP paths (sharding, gathering, sharded
checkpoints). FSDP 1 needs an accelerator in PyTorch itself.
"""

from __future__ import annotations

import os
import runpy
import sys

from accelerate import state
from accelerate.utils import DistributedType

_init = state.AcceleratorState.__init__


def _fsdp_on_cpu(self, *args, fsdp_plugin=None, **kwargs) -> None:
    _init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
    if self.distributed_type == DistributedType.MULTI_CPU and os.environ.get("ACCELERATE_USE_FSDP") == "true":
        self.distributed_type = DistributedType.FSDP
        if self._mixed_precision != "no" and fsdp_plugin is not None:  # as accelerate does on GPUs
            fsdp_plugin.set_mixed_precision(self._mixed_precision)
        self.fsdp_plugin = fsdp_plugin
        state.PartialState._shared_state["distributed_type"] = DistributedType.FSDP


if __name__ == "__main__":
    state.AcceleratorState.__init__ = _fsdp_on_cpu
    sys.argv = ["runners", *sys.argv[1:]]
    runpy.run_module("runners", run_name="__main__")

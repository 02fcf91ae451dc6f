"""No-Positive-Resampling (ScaleRL): prompts that the policy already solves are dropped for good.

TRL's ``RepeatSampler`` orders prompts into generation batches; this subclass skips
prompts in a shared ``dropped`` set that the trainer fills as pass-rate history
accumulates. Chunks are formed lazily, so a prompt dropped now is never drawn again,
and the sampler still yields exactly ``len(self)`` indices (it reshuffles the
remaining prompts when a pass runs out), so TRL's step arithmetic is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from trl.trainer.utils import RepeatSampler


class NoPositiveResamplingSampler(RepeatSampler):
    def __init__(self, *args, dropped: set[int], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.dropped = dropped

    def _permutation(self) -> list[int]:
        if self.shuffle:
            return torch.randperm(self.num_samples, generator=self.generator).tolist()
        return list(range(self.num_samples))

    def _next_chunk(self, order: list[int]) -> list[int]:
        chunk: list[int] = []
        for _ in range(2):  # at most one reshuffle: the rest of this pass, then a fresh one
            while order and len(chunk) < self.batch_size:
                i = order.pop()
                if i not in self.dropped and i not in chunk:
                    chunk.append(i)
            if len(chunk) == self.batch_size:
                return chunk
            order[:] = self._permutation()[::-1]
        live = self.num_samples - len(self.dropped)
        raise RuntimeError(
            f"No-Positive-Resampling dropped {len(self.dropped)} of {self.num_samples} prompts: only {live} remain, "
            f"fewer than the {self.batch_size} prompts a batch needs. Use more training prompts, a higher "
            "algorithm.npr_threshold, or algorithm.sampling: uniform."
        )

    def __iter__(self) -> Iterator[int]:
        order = self._permutation()[::-1]
        for _ in range(len(self) // (self.batch_size * self.mini_repeat_count * self.repeat_count)):
            chunk = self._next_chunk(order)
            for _ in range(self.repeat_count):
                for index in chunk:
                    for _ in range(self.mini_repeat_count):
                        yield index

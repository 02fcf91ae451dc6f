"""Where a training step spends its time and memory: generation, reward, update, evaluation.

``PhaseProfiler`` times each phase and records its peak device memory (CUDA allocated and
reserved, reset at the phase's start) and the host's resident memory at its end. ``pop()``
returns the accumulated numbers as metrics and starts a new step; the run-wide peaks stay.
"""

from __future__ import annotations

import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import torch

GB = 2**30


def host_peak_rss_gb() -> float:
    """Peak resident memory of this process so far (kilobytes on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / GB if sys.platform == "darwin" else peak * 1024 / GB


class PhaseProfiler:
    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        self.proc = psutil.Process()
        self.run_peak_allocated = 0.0
        self.run_peak_reserved = 0.0
        self._open: dict[str, float] = {}
        self._new_step()

    def _new_step(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.allocated: dict[str, float] = defaultdict(float)
        self.reserved: dict[str, float] = defaultdict(float)
        self.rss: dict[str, float] = defaultdict(float)

    def begin(self, name: str) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self._open[name] = time.perf_counter()

    def end(self, name: str) -> None:
        t0 = self._open.pop(name, None)
        if t0 is None:
            return
        if self.cuda:
            torch.cuda.synchronize()
            alloc, reserved = torch.cuda.max_memory_allocated() / GB, torch.cuda.max_memory_reserved() / GB
            self.allocated[name] = max(self.allocated[name], alloc)
            self.reserved[name] = max(self.reserved[name], reserved)
            self.run_peak_allocated = max(self.run_peak_allocated, alloc)
            self.run_peak_reserved = max(self.run_peak_reserved, reserved)
        self.seconds[name] += time.perf_counter() - t0
        self.rss[name] = max(self.rss[name], self.proc.memory_info().rss / GB)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.begin(name)
        try:
            yield
        finally:
            self.end(name)

    def pop(self) -> dict[str, float]:
        """Metrics of the phases since the last call (``time/…_seconds``, ``memory/…_gb``), plus run peaks."""
        out: dict[str, float] = {}
        for name, secs in self.seconds.items():
            out[f"time/{name}_seconds"] = secs
            out[f"memory/{name}_host_rss_gb"] = self.rss[name]
            if self.cuda:
                out[f"memory/{name}_allocated_gb"] = self.allocated[name]
                out[f"memory/{name}_reserved_gb"] = self.reserved[name]
        out["memory/host_peak_rss_gb"] = host_peak_rss_gb()
        if self.cuda:
            out["memory/peak_allocated_gb"] = self.run_peak_allocated
            out["memory/peak_reserved_gb"] = self.run_peak_reserved
        self._new_step()
        return out

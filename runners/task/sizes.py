"""The embedded base models' names and version: their sizes, the build version, and where a build
is cached. What parsing a recipe and naming a run need, without torch (``basemodel`` builds them)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from runners.task.tasks import ArithmeticTask

BUILD_VERSION = 1  # bump when the tokenizer, task rendering or SFT code changes what gets built
# basemodel.build_fingerprint() when BUILD_VERSION was last reviewed: tests/test_embedded.py fails when
# the build code changes until both are looked at (bump the version if what is built changes, then this)
BUILD_FINGERPRINT = "95981ae85dcef8ad"


@dataclass(frozen=True)
class ModelSize:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    sft_steps: int
    sft_batch: int
    sft_lr: float


SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(hidden=64, layers=2, heads=4, intermediate=128, sft_steps=150, sft_batch=32, sft_lr=3e-3),
    "small": ModelSize(hidden=128, layers=3, heads=4, intermediate=384, sft_steps=700, sft_batch=64, sft_lr=2e-3),
    "medium": ModelSize(hidden=384, layers=6, heads=6, intermediate=1536, sft_steps=1500, sft_batch=256, sft_lr=1e-3),
}


def default_cache_dir() -> Path:
    return Path(os.environ.get("PRL_CACHE", "artifacts")) / "base-models"


def build_key(size: str, task: ArithmeticTask) -> str:
    spec = {"size": asdict(SIZES[size]), "task": task.to_dict(), "version": BUILD_VERSION}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def base_model_path(size: str, task: ArithmeticTask, cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / f"{size}-{build_key(size, task)}"

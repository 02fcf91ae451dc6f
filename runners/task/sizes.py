"""The embedded base models' names and version: their sizes (with each one's parameter count), the
build version, and where a build is cached. What parsing a recipe and naming a run need, without
torch (``basemodel`` builds them)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from runners.task.tasks import ArithmeticTask

BUILD_VERSION = 1  # bump when the tokenizer, task rendering or SFT code changes what gets built
# basemodel.build_fingerprint() when BUILD_VERSION was last reviewed: tests/test_embedded.py fails when
# the build code changes until both are looked at (bump the version if what is built changes, then this).
# Last review: large's SFT went from 1,500 to 3,000 steps; not bumped, as a size's spec is in its build
# key already (large's cached 1,500-step builds are not reused) and no other size's build changed.
# Re-recorded, not re-reviewed, when the fingerprint's text became the same on every Python (3.10-3.13).
# Reviewed again for build seeds and deterministic builds (issue 59): not bumped. A recipe without
# model.build_seed builds with the task's seed as before, and on the CPU the deterministic build makes
# the very weights the default one did (tiny: 1147e7bb1898 both ways, results/builds-gpu); on a GPU no
# two builds of a key were the same weights before (two default micro builds on one H200 differed), so
# there was no build to keep.
BUILD_FINGERPRINT = "2aa527ed2b2e6034"


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
    # the across-size family (issue 44), 0.46M to 25.8M parameters with medium (14.2M) among them: width
    # and depth grow together, every one built as medium is (1,500 SFT steps of 256 demonstrations, the
    # learning rate falling with size) except large, which needs 3,000 steps to be the best base model
    # (with 1,500 it started below mini and fell under RL: results/scale-probe/RESULTS.md); pico (27k) is
    # the second size a CPU test's scale campaign can afford
    "pico": ModelSize(hidden=32, layers=2, heads=2, intermediate=64, sft_steps=100, sft_batch=32, sft_lr=3e-3),
    "nano": ModelSize(hidden=96, layers=3, heads=4, intermediate=384, sft_steps=1500, sft_batch=256, sft_lr=2e-3),
    "micro": ModelSize(hidden=160, layers=4, heads=5, intermediate=640, sft_steps=1500, sft_batch=256, sft_lr=1.5e-3),
    "mini": ModelSize(hidden=256, layers=5, heads=8, intermediate=1024, sft_steps=1500, sft_batch=256, sft_lr=1.2e-3),
    "large": ModelSize(hidden=448, layers=8, heads=7, intermediate=1792, sft_steps=3000, sft_batch=256, sft_lr=7e-4),
}


def vocab_size() -> int:
    """The embedded tokenizer's vocabulary (``runners.task.tokenizer``): its specials, tags and characters."""
    from runners.task.tokenizer import CHARS, TAGS  # noqa: PLC0415 - transformers, only when counting

    return 3 + len(TAGS) + len(CHARS)


def parameter_count(size: str) -> int:
    """The parameters of an embedded size's Llama (untied head, as many key/value heads as heads), counted
    from its shape: what ``sum(p.numel())`` of the built model gives (tests/test_embedded.py checks)."""
    s, vocab = SIZES[size], vocab_size()
    layer = 4 * s.hidden * s.hidden + 3 * s.hidden * s.intermediate + 2 * s.hidden  # attention, MLP, 2 norms
    return s.layers * layer + 2 * vocab * s.hidden + s.hidden  # + embedding, LM head, final norm


def default_cache_dir() -> Path:
    return Path(os.environ.get("PRL_CACHE", "artifacts")) / "base-models"


def build_key(size: str, task: ArithmeticTask, build_seed: int | None = None) -> str:
    """What a build of ``size`` for ``task`` is made from (its shape, SFT, task and the build code's
    version), hashed; ``build_seed`` (``model.build_seed``) names an independent build of the same
    configuration, and ``None`` the one build every recipe had before build seeds (its key unchanged).
    The key names a configuration, not weights: ``basemodel.weights_sha256`` names those."""
    spec = {"size": asdict(SIZES[size]), "task": task.to_dict(), "version": BUILD_VERSION}
    if build_seed is not None:
        spec["build_seed"] = build_seed
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def base_model_path(
    size: str, task: ArithmeticTask, cache_dir: Path | None = None, build_seed: int | None = None
) -> Path:
    return (cache_dir or default_cache_dir()) / f"{size}-{build_key(size, task, build_seed)}"

"""The identity of a base model's weights: the sha256 of a checkpoint's weight files
(``weights_sha256``), and of the weights a run starts from (``base_weights``: an embedded build's
record of it in ``build_info.json``, else computed). A build key names a configuration; this names
what a build made. No torch: a campaign's process hashes without importing it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

WEIGHT_FILES = ("*.safetensors", "*.bin")  # a Hugging Face checkpoint's weights (sharded or not), not its index


def weights_sha256(path: str | Path) -> str:
    """The sha256 of a checkpoint's weights: each weight file's name and bytes, in name order (the
    config, tokenizer and build record left out). Two folders with the same weights give the same hash."""
    p = Path(path)
    files = sorted(f for pattern in WEIGHT_FILES for f in p.glob(pattern) if f.is_file())
    if not files:
        raise FileNotFoundError(f"model {p}: no weight file ({', '.join(WEIGHT_FILES)})")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def base_weights(path: str | Path) -> str:
    """The sha256 of the weights a run starts from: an embedded build's record of them
    (``build_info.json``; written there if a build older than the record lacks it), else computed
    from the checkpoint's files (``model.path``)."""
    p = Path(path)
    record = p / "build_info.json"
    if not record.is_file():
        return weights_sha256(p)
    info = json.loads(record.read_text())
    if "weights_sha256" not in info:
        info["weights_sha256"] = weights_sha256(p)
        tmp = record.with_name(f".build_info.json.{os.getpid()}")
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        os.replace(tmp, record)  # whole or absent: another process may read it at the same time
    return info["weights_sha256"]

"""Corrupt checkpoints, read-only folders and a corrupt store (#42 items 5-7): a checkpoint changed
after its save is skipped for the one before by its recorded sha256; a read-only artifacts folder or
base-model cache, and an MLflow store that is no SQLite database, each end a command in one line
naming the file and the fix, before compute is spent or an MLflow run is created."""

from __future__ import annotations

import json

from tests.campaigns import TINY as CAMPAIGN_TINY

TINY = {**CAMPAIGN_TINY, "train.steps": 4, "train.save_every": 2, "eval.every": 2}  # the tiny run, 4 steps


def test_a_checkpoint_corrupted_after_its_save_is_skipped_for_the_one_before(tiny_base, tmp_path):
    """4 KiB overwritten inside checkpoint-4's optimizer.pt keep its size and its zip directory, so
    the file looks whole; its sha256, recorded at the save, tells. The re-run says which file
    changed and resumes from checkpoint-2 (before, it resumed from the corrupt state). A checkpoint
    saved before checksums were recorded still resumes."""
    from runners.recipe import load_recipe
    from runners.rl.train import STATE_FILE, last_complete_checkpoint, metric_records, train

    recipe, run = load_recipe("scalerl", TINY), tmp_path / "run"
    train(recipe, run, log=lambda m: None)
    optimizer = run / "checkpoints" / "checkpoint-4" / "optimizer.pt"
    size = optimizer.stat().st_size
    with optimizer.open("r+b") as fh:
        fh.seek(size // 2)
        fh.write(b"\xff" * 4096)  # NaN bytes in the optimizer's moments
    assert optimizer.stat().st_size == size
    (run / "done.json").unlink()  # killed before the run could finish
    said: list[str] = []
    train(recipe, run, log=said.append)
    assert (
        f"[{recipe.name}] skipping checkpoint-4: optimizer.pt corrupted (its sha256 differs from the one "
        "recorded at its save)" in said
    ), said
    assert any(m.endswith(f"resuming from {run / 'checkpoints' / 'checkpoint-2'}") for m in said), said
    assert [r["step"] for r in metric_records(run / "metrics.jsonl")] == [0, 2, 4]
    assert last_complete_checkpoint(run / "checkpoints") == (run / "checkpoints" / "checkpoint-4", [])  # saved anew

    state = run / "checkpoints" / "checkpoint-4" / STATE_FILE
    legacy = json.loads(state.read_text())
    del legacy["sha256"]  # as a checkpoint saved before this change
    state.write_text(json.dumps(legacy))
    with optimizer.open("r+b") as fh:  # a change no checksum can tell
        fh.seek(size // 2)
        fh.write(b"\xff" * 4096)
    assert last_complete_checkpoint(run / "checkpoints") == (run / "checkpoints" / "checkpoint-4", [])

"""Sharded runs (FSDP through accelerate) on CPU: train, evaluate, save, resume; the per-GPU plan.

accelerate runs FSDP on accelerator devices only, so the end-to-end test launches the runner through
``tests.fsdp_cpu``, which lifts that one decision: two gloo CPU processes under PyTorch's FSDP 2,
sharded parameters, gathered generation, sharded checkpoints. FSDP 1 needs a GPU in PyTorch itself
(results/fsdp measured both on GPUs). A GPU machine runs the same CPU tests, CUDA hidden from their
processes (``cpu_only_env``): none is skipped there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml

from runners.recipe import RecipeError, load_recipe
from runners.rl.memory import Dims, check_fits, estimate
from runners.rl.sharding import Layout
from runners.tracking.server_processes import free_port
from tests.conftest import SMALL_RUN, cpu_only_env

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "experiments" / "accelerate"


def cpu_config(tmp_path: Path, version: int) -> Path:
    """The shipped example config, as a CPU launch needs it: nothing to sync module states onto."""
    cfg = yaml.safe_load((CONFIGS / f"fsdp{version}.yaml").read_text())
    cfg["fsdp_config"]["fsdp_sync_module_states"] = False
    path = tmp_path / f"fsdp{version}-cpu.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def launch(config: Path, run_dir: Path, *, wait: bool = True):
    """``python -m runners train`` of the distributed tests' run on 2 CPU processes, FSDP 2 with
    ``config``; on a GPU machine too (CUDA hidden: :func:`cpu_only_env`)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--config_file"]
    cmd += [str(config), "--mixed_precision", "no", "--main_process_port", str(free_port())]  # never 29500 twice
    cmd += ["-m", "tests.fsdp_cpu", "train", "scalerl"]
    cmd += [*[f"--set={s}" for s in SMALL_RUN], "--untracked", "--run-dir", str(run_dir)]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=cpu_only_env())
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=cpu_only_env())
    noise = ("FutureWarning", "warnings.warn(")
    err = "\n".join(line for line in res.stderr.splitlines() if not any(n in line for n in noise))
    assert res.returncode == 0, res.stdout[-2000:] + err[-6000:]
    return res


def records(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def kill_tree(pid: int) -> None:
    parent = psutil.Process(pid)
    for p in [*parent.children(recursive=True), parent]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.xdist_group("ddp")  # with tests/test_distributed.py, on the one worker that runs ddp_run
def test_fsdp2_run_trains_evaluates_saves_whole_models_and_resumes_after_a_kill(tmp_path, tiny_base, ddp_run):
    config = cpu_config(tmp_path, 2)
    straight = tmp_path / "fsdp"
    launch(config, straight)
    recs = records(straight)
    assert sorted(recs) == [0, 2, 4] and all(r["val/prompts"] == 9.0 for r in recs.values())
    assert (straight / "done.json").is_file()
    # sharded for real: the Trainer wrote one shard per process, not a whole model
    ckpt = straight / "checkpoints" / "checkpoint-4"
    assert sorted(p.name for p in (ckpt / "pytorch_model_fsdp_0").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert not (ckpt / "model.safetensors").exists()

    # best/ is a whole model: it loads on its own, every tensor at its full shape; a step-0 best is the base model
    from transformers import AutoModelForCausalLM

    best = AutoModelForCausalLM.from_pretrained(straight / "best")
    base = AutoModelForCausalLM.from_pretrained(tiny_base).state_dict()
    saved = best.state_dict()
    assert saved.keys() == base.keys() and all(saved[k].shape == base[k].shape for k in base)
    if json.loads((straight / "best" / "best.json").read_text())["step"] == 0:
        assert all(torch.equal(saved[k], base[k]) for k in base)

    # evaluation generates with whole parameters: step 0 (before any update) is DDP's to the digit
    ddp = records(ddp_run)
    for key in ("val/mean_at_16", "val/pass_at_16", "val/format_error_rate"):
        assert recs[0][key] == ddp[0][key], key
    assert [recs[s]["compute/samples"] for s in (2, 4)] == [ddp[s]["compute/samples"] for s in (2, 4)]

    # killed after its first checkpoint, it resumes from it and ends where the uninterrupted run ended
    killed = tmp_path / "killed"
    proc = launch(config, killed, wait=False)
    marker = killed / "checkpoints" / "checkpoint-2" / "prl_state.json"
    deadline = time.time() + 600
    while not marker.is_file() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    kill_tree(proc.pid)
    proc.wait()
    assert marker.is_file() and not (killed / "done.json").exists(), "the kill came too late to test a resume"
    out = launch(config, killed).stdout
    assert "resuming from" in out and "checkpoint-2" in out, out[-2000:]
    again = records(killed)
    assert sorted(again) == [0, 2, 4]  # no evaluation recorded twice
    for step in (2, 4):
        for key in ("compute/samples", "compute/tokens", "val/mean_at_16", "val/format_error_rate"):
            assert again[step][key] == recs[step][key], (step, key)


def test_fsdp_on_cpu_processes_is_refused_in_one_line():
    """FSDP over CPU processes (CUDA hidden, so a GPU machine is such a machine too) is refused."""
    res = subprocess.run(
        [sys.executable, "-m", "runners", "train", "scalerl", "--gpus", "2", "--untracked"]
        + ["--accelerate-config", str(CONFIGS / "fsdp1.yaml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=cpu_only_env(),
    )
    assert res.returncode == 2 and "FSDP needs GPUs" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("version", [1, 2])
def test_the_layout_read_from_accelerates_launch_is_the_config_files(tmp_path, version):
    """What ``accelerate launch`` really exports for each shipped config (read inside a launched
    process) gives the layout that ``plan --accelerate-config`` reads from the file."""
    probe = tmp_path / "probe.py"
    # one write per process: the two share a pipe, and with PYTHONUNBUFFERED (make exports it)
    # print's separate writes of "LAYOUT", " " and the layout interleaved ("LAYOUTLAYOUT ...", seen once)
    probe.write_text(
        "import sys\nfrom runners.rl.sharding import Layout\nsys.stdout.write(f'LAYOUT {Layout.from_env()!r}\\n')\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--config_file"]
        + [str(cpu_config(tmp_path, version)), "--main_process_port", str(free_port()), str(probe)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    seen = {line for line in res.stdout.splitlines() if line.startswith("LAYOUT")}
    expected = Layout.from_config(CONFIGS / f"fsdp{version}.yaml", 2)
    assert seen == {f"LAYOUT {expected!r}"}, res.stdout + res.stderr[-2000:]
    assert expected == Layout(2, version, "FULL_SHARD")


def test_plan_says_what_each_gpu_holds_sharded_or_replicated(tmp_path):
    recipe = load_recipe("scalerl-gpu4")
    one, ddp = estimate(recipe), estimate(recipe, layout=Layout(4))
    fsdp = estimate(recipe, layout=Layout(4, 2, "FULL_SHARD"))
    state = "weights, gradients, AdamW state"
    assert fsdp[f"{state} (1/4 on each: FSDP 2 FULL_SHARD)"] == pytest.approx(one[state] / 4)
    assert ddp[state] == one[state]  # DDP replicates the state...
    assert any(k.startswith("DDP gradient buckets") for k in ddp)  # ...and its gradient buckets
    assert any(k.startswith("generation KV cache (128 completions)") for k in fsdp)  # 512 rollouts / 4
    # a 5.8B model (28 x 4096): DDP cannot fit an 80 GiB card, FSDP over 4 can
    h, n, inter, v = 4096, 28, 11264, 104
    big = Dims(n * (4 * h * h + 3 * h * inter) + 2 * v * h, h, n, h // 64, v, inter)
    few = load_recipe("scalerl-gpu4", {"batch.prompts": 8, "batch.generations": 4, "eval.batch_prompts": 4})
    assert estimate(few, big, Layout(4))["peak"] > 80 > estimate(few, big, Layout(4, 1))["peak"]

    def plan(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "runners", "plan", "scalerl-gpu4", *args]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)

    text = plan("--gpus", "4", "--accelerate-config", str(CONFIGS / "fsdp1.yaml")).stdout
    assert "Device memory on each GPU, FSDP 1 FULL_SHARD over 4 processes" in text
    assert "(1/4 on each: FSDP 1 FULL_SHARD)" in text and "With DDP over 4 processes" in text
    assert "processes (one per GPU)" in text and "x 4 processes" in text
    missing = plan("--gpus", "2", "--accelerate-config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "no such file" in missing.stderr and "Traceback" not in missing.stderr
    with pytest.raises(RecipeError, match=r"with FSDP 2 FULL_SHARD over 4 processes, each device has"):
        check_fits(load_recipe("scalerl-gpu4"), 1.0, 1.0, layout=Layout(4, 2))


def test_memory_estimate_bounds_the_peaks_measured_under_fsdp_and_ddp():
    """results/fsdp/bench.csv, an untrained 8.2B Llama (40 x 4096) on 4 x H200 (139.8 GiB each): under
    FSDP 1 and 2 the estimate for each GPU is above every process's measured peak, by at most 1.5x;
    under DDP it is above the card, and that run did run out of memory."""
    import pandas as pd

    from runners.task.tokenizer import build_tokenizer

    measured = pd.read_csv(ROOT / "results" / "fsdp" / "bench.csv")
    h, n, inter, v = 4096, 40, 11264, len(build_tokenizer())
    dims = Dims(n * (4 * h * h + 3 * h * inter) + 2 * v * h, h, n, h // 64, v, inter)
    recipe = load_recipe(
        "scalerl-gpu4",
        {
            "batch.prompts": 8,
            "batch.generations": 4,
            "batch.micro_batch": 8,
            "length.control": "none",
            "length.max_tokens": 32,
            "eval.prompts": 8,
            "eval.samples": 4,
            "eval.batch_prompts": 4,
        },
    )
    layouts = {"fsdp1": Layout(4, 1), "fsdp2": Layout(4, 2), "ddp": Layout(4)}
    assert set(measured.label) == set(layouts)
    for _, row in measured.iterrows():
        assert row.parameters == dims.params
        est = estimate(recipe, dims, layouts[row.label])["peak"]
        if row.label == "ddp":
            assert row.status == "out of memory" and est > 139.8, (est, row.status)
        else:
            peaks = [float(x) for x in row.peak_allocated_gib_each.split()]
            assert len(peaks) == 4 and all(p <= est <= 1.5 * p for p in peaks), (row.label, peaks, est)

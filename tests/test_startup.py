"""What a campaign pays around its runs' work: its process, on a machine whose torch was built for no
GPU, counts its devices without importing torch (2 s of CPU in every campaign) and still agrees with
torch's own count wherever torch was built for CUDA or ROCm; the local backend sees a run's end at
once, not at its next one-second beat."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import sys
import os
from runners.campaign.backends.local import devices, visible_ids
found, loaded = devices(), "torch" in sys.modules
import torch
count = visible_ids(os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count()) or [None]
print(found == count, loaded, torch.version.cuda is None and torch.version.hip is None, torch.cuda.device_count())
"""


def test_a_campaign_counts_its_devices_without_torch_where_torch_has_no_gpu_build():
    """Before, ``devices()`` imported torch to learn that a CPU-only build sees no GPU."""
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    same, loaded, cpu_build, gpus = res.stdout.split()
    assert same == "True"  # what torch itself counts, on any machine
    assert loaded == str(cpu_build != "True")  # imported only where it could see a GPU
    if int(gpus) > 1:  # a campaign started on the last GPU places its runs there, not on GPU 0
        last = str(int(gpus) - 1)
        probe = "from runners.campaign.backends.local import devices; print(devices())"
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": last}
        res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env)
        assert res.stdout.strip() == repr([last]), res.stdout + res.stderr[-2000:]


def test_the_local_backend_sees_a_run_end_at_once_and_keeps_its_beat_otherwise(tmp_path):
    """Before, every poll slept a whole second first: each run's end, and the start of a run waiting
    for its slot, came up to a second late (a campaign ends a run and starts the next in one poll)."""
    from runners.campaign.backends.local import Launch, LocalBackend, spawn
    from runners.campaign.load import expand, load_campaign

    camp = load_campaign("loo-cpu")
    backend = LocalBackend(camp, log=lambda m: None)
    backend.retried = {}
    spec = expand(camp)[0]
    (tmp_path / "ends").mkdir()
    (tmp_path / "runs").mkdir()
    ends = spawn(Launch(spec, [sys.executable, "-c", "pass"], {}, tmp_path / "ends"), None, 1)
    ends.proc.wait()
    backend.running = [ends]
    t0 = time.monotonic()
    (ended,) = backend.poll()
    assert time.monotonic() - t0 < 0.5 and ended.spec == spec
    runs = spawn(Launch(spec, [sys.executable, "-c", "import time; time.sleep(60)"], {}, tmp_path / "runs"), None, 1)
    backend.running = [runs]
    try:
        t0 = time.monotonic()
        assert backend.poll() == [] and time.monotonic() - t0 >= 0.95  # a running run: the progress beat
    finally:
        runs.proc.kill()
        runs.proc.wait()
        runs.logf.close()

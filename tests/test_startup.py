"""What a process pays before it works: a campaign's process on a machine whose torch was built for
no GPU counts its devices without importing torch (2 s of CPU in every campaign), and still agrees
with torch's own count wherever torch was built for CUDA or ROCm."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import sys
from runners.ops.local import devices
found, loaded = devices(), "torch" in sys.modules
import torch
count = [str(i) for i in range(torch.cuda.device_count())] or [None]
print(found == count, loaded, torch.version.cuda is None and torch.version.hip is None)
"""


def test_a_campaign_counts_its_devices_without_torch_where_torch_has_no_gpu_build():
    """Before, ``devices()`` imported torch to learn that a CPU-only build sees no GPU."""
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    same, loaded, cpu_build = res.stdout.split()
    assert same == "True"  # what torch itself counts, on any machine
    assert loaded == str(cpu_build != "True")  # imported only where it could see a GPU

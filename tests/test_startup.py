"""What a campaign pays around its runs' work: its process, on a machine whose torch was built for no
GPU, counts its devices without importing torch (2 s of CPU in every campaign) and still agrees with
torch's own count wherever torch was built for CUDA or ROCm; the local backend sees a run's end at
once, not at its next one-second beat."""

from __future__ import annotations

import os
import subprocess
import sys
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


class Clock:
    """The local backend's ``time`` for a test: ``monotonic`` reads a clock that only its ``sleep`` moves,
    and each sleep is recorded; ``then`` is called at each sleep (a run ending mid-wait)."""

    def __init__(self, then=lambda slept: None):
        self.now, self.slept, self.then = 0.0, [], then

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        self.then(self.slept)


def test_the_local_backend_sees_a_run_end_at_once_and_keeps_its_beat_otherwise(tmp_path, monkeypatch):
    """Before, every poll slept a whole second first: each run's end, and the start of a run waiting
    for its slot, came up to a second late (a campaign ends a run and starts the next in one poll).
    What a poll waits is read from the backend's own clock (:class:`Clock`), not from the wall."""
    from runners.campaign.backends import local
    from runners.campaign.backends.local import Launch, LocalBackend, spawn
    from runners.campaign.load import expand, load_campaign

    camp = load_campaign("loo-cpu")
    backend = LocalBackend(camp, log=lambda m: None)
    backend.retried = {}
    spec = expand(camp)[0]
    for d in ("ends", "runs", "dies"):
        (tmp_path / d).mkdir()
    ends = spawn(Launch(spec, [sys.executable, "-c", "pass"], {}, tmp_path / "ends"), None, 1)
    ends.proc.wait()
    backend.running = [ends]
    monkeypatch.setattr(local, "time", clock := Clock())
    (ended,) = backend.poll()
    assert clock.slept == [] and ended.spec == spec  # an ended run: no wait at all
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    runs = spawn(Launch(spec, sleeper, {}, tmp_path / "runs"), None, 1)
    dies = spawn(Launch(spec, sleeper, {}, tmp_path / "dies"), None, 1)
    try:
        backend.running = [runs]
        monkeypatch.setattr(local, "time", clock := Clock())
        assert backend.poll() == []  # a running run: the progress beat, one second
        assert clock.now >= 1.0 and clock.now - clock.slept[-1] < 1.0, clock.slept

        def end_it(slept):  # the run ends during the third sleep of the wait
            if len(slept) == 3:
                dies.proc.kill()
                dies.proc.wait()

        backend.running = [dies]
        monkeypatch.setattr(local, "time", clock := Clock(end_it))
        (ended,) = backend.poll()  # seen at the next look, not at the end of the beat
        assert len(clock.slept) == 3 and clock.now < 1.0 and not ended.ok, clock.slept
    finally:
        for r in (runs, dies):
            r.proc.kill()
            r.proc.wait()
            r.logf.close()

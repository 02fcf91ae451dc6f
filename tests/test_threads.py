"""CPU threads (runners/threads.py): the cores a process may use (affinity and cgroup quota), and the
OpenMP settings that real ``python -m runners`` processes and a campaign's runs start with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from runners.campaign.backends.local import Launch, spawn
from runners.campaign.load import expand, load_campaign
from runners.threads import cgroup_cpus, usable_cores

ROOT = Path(__file__).resolve().parents[1]
AFFINITY = len(os.sched_getaffinity(0))


def _cgroup(tmp: Path, proc_line: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A cgroup tree as the kernel lays it out (files under ``tmp/fs``) and a /proc/self/cgroup naming it."""
    for rel, text in files.items():
        (tmp / "fs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "fs" / rel).write_text(text + "\n")
    (tmp / "cgroup").write_text(proc_line + "\n")
    return tmp / "fs", tmp / "cgroup"


def test_a_cgroup_quota_caps_the_cores(tmp_path):
    """A container's or job's CPU quota counts, not only the affinity mask: v2's cpu.max on the process's
    cgroup or an ancestor (the tightest wins), v1's cfs quota; no quota leaves the affinity mask."""
    root, proc = _cgroup(
        tmp_path / "v2",
        "0::/job/step",
        {"job/cpu.max": "150000 100000", "job/step/cpu.max": "max 100000", "cpu.max": "max 100000"},
    )
    assert cgroup_cpus(root, proc) == 1.5
    assert usable_cores(root, proc) == min(AFFINITY, 2)
    root, proc = _cgroup(
        tmp_path / "v1",
        "4:memory:/x\n3:cpu,cpuacct:/docker/abc",
        {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "100000", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"},
    )
    assert cgroup_cpus(root, proc) == 1.0 and usable_cores(root, proc) == 1
    root, proc = _cgroup(
        tmp_path / "none",
        "3:cpu,cpuacct:/",
        {"cpu,cpuacct/cpu.cfs_quota_us": "-1", "cpu,cpuacct/cpu.cfs_period_us": "100000"},
    )
    assert cgroup_cpus(root, proc) is None and usable_cores(root, proc) == AFFINITY


def test_a_campaign_run_gets_its_share_and_waits_passively(tmp_path):
    """A run the local scheduler starts sees its share of the cores in torch and OpenMP's passive wait
    (spinning threads made a base-model build beside one busy process 7x slower on 2 cores)."""
    spec = expand(load_campaign("loo-cpu"))[0]
    code = "import os, torch; print(os.environ['OMP_WAIT_POLICY'], torch.get_num_threads())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        run = spawn(Launch(spec, [sys.executable, "-c", code], {}, tmp_path), None, 1)
        assert run.proc.wait(timeout=120) == 0
    finally:
        os.environ.clear()
        os.environ.update(saved)
        run.logf.close()
    assert (tmp_path / "run.log").read_text().split() == ["PASSIVE", "1"]


def test_python_m_runners_sizes_a_compute_command_before_torch_loads():
    """`python -m runners base-model|train` in a process of its own: OMP_NUM_THREADS = the usable cores
    (what torch then uses) and a passive wait, set before torch is imported; another command sets the
    wait alone, so the runs it starts get their share, not every core."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    probe = (
        "import os, sys, contextlib, io; sys.argv = ['runners'] + sys.argv[1:]\n"
        "from runners.cli import main\n"
        "with contextlib.redirect_stderr(io.StringIO()): main()\n"
        "print(os.environ['OMP_WAIT_POLICY'], os.environ.get('OMP_NUM_THREADS'))\n"
        "if sys.argv[1] == 'base-model': import torch; print(torch.get_num_threads())"
    )
    recipe = ["base-model", "scalerl", "--set", "model.path=/nonexistent", "--set", "model.size=null"]
    out = subprocess.run([sys.executable, "-c", probe, *recipe], env=env, cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.split() == ["PASSIVE", str(usable_cores()), str(usable_cores())], out.stderr
    out = subprocess.run(
        [sys.executable, "-c", probe, "plan", "nonexistent"], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert out.stdout.split() == ["PASSIVE", "None"], out.stderr

"""The set-up's installs say what they install and how far they got (runners.ops.install), with
pip's own exit code; run here as pip's dry run over the installed set, so nothing changes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def install(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "runners.ops.install", "--dry-run", "--no-index", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)


def test_an_install_names_what_it_installs_and_counts_it():
    pinned = sum(1 for line in (ROOT / "requirements.lock").read_text().splitlines() if "==" in line)
    res = install("-r", "requirements.lock")
    assert res.returncode == 0, res.stdout
    lines = res.stdout.splitlines()
    assert lines[0].startswith(f"installing {pinned} pinned package(s) from requirements.lock into {sys.prefix}")
    assert any(line.startswith(f"  {pinned}/{pinned} checked or downloaded") for line in lines)
    assert lines[-1].startswith("installed in ")


def test_a_failed_install_shows_pips_reason_and_exit_code(tmp_path):
    bad = tmp_path / "bad.lock"
    bad.write_text("nosuchpackage-prl==1.0\n")
    res = install("-r", str(bad))
    assert res.returncode == 1 and "pip failed; its last lines:" in res.stdout
    assert "No matching distribution found for nosuchpackage-prl==1.0" in res.stdout

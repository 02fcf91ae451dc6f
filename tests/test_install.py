"""The set-up's installs say what they install and how far they got (runners.setup.install), with
the installer's own exit code, through uv (the Makefile's) and through pip; run here as dry runs
over the installed set, so nothing changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["uv", "pip"])
def installer(request) -> str:
    if request.param == "uv":
        pytest.importorskip("uv", reason="make setup installs uv into .venv")
    return request.param


def install(installer: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "runners.setup.install", "--dry-run", "--no-index", *args]
    env = {**os.environ, "PRL_INSTALLER": installer}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)


def test_an_install_names_what_it_installs_and_counts_it(installer):
    pinned = sum(1 for line in (ROOT / "requirements.lock").read_text().splitlines() if "==" in line)
    res = install(installer, "-r", "requirements.lock")
    assert res.returncode == 0, res.stdout
    lines = res.stdout.splitlines()
    head = f"installing {pinned} pinned package(s) from requirements.lock into {sys.prefix} ({installer})"
    assert lines[0] == head
    done = f"  {pinned}/{pinned} checked or downloaded" if installer == "pip" else f"  Checked {pinned} packages"
    assert any(line.startswith(done) for line in lines), lines
    assert lines[-1].startswith("installed in ")


def test_a_failed_install_shows_the_installers_reason_and_exit_code(installer, tmp_path):
    bad = tmp_path / "bad.lock"
    bad.write_text("nosuchpackage-prl==1.0\n")
    res = install(installer, "-r", str(bad))
    assert res.returncode == 1 and f"{installer} failed; its last lines:" in res.stdout
    assert "nosuchpackage-prl" in res.stdout.split("its last lines:")[1]


def test_uv_is_given_the_package_sources_pip_is_configured_with(tmp_path):
    """pip's own precedence: PIP_* variables over [install] over [global]."""
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\nfind-links = /opt/a /opt/b\nextra-index-url = file:///x/simple\ncert = /c.pem\n"
        "index-url = https://global.example/simple\n[install]\nindex-url = https://install.example/simple\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=str(conf), PIP_CONSTRAINT="/k.txt")
    code = "import json; from runners.setup.install import pip_sources; print(json.dumps(pip_sources()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    args, extra_env = json.loads(out.stdout)
    pairs = list(zip(args[::2], args[1::2], strict=True))
    assert ("--index-url", "https://install.example/simple") in pairs
    assert ("--extra-index-url", "file:///x/simple") in pairs
    assert ("--find-links", "/opt/a") in pairs and ("--find-links", "/opt/b") in pairs
    assert [v for flag, v in pairs if flag == "--constraint"] == ["/k.txt"]
    assert extra_env == {"SSL_CERT_FILE": "/c.pem"}


def test_an_unknown_installer_is_named_with_the_choices():
    res = install("conda", "-r", "requirements.lock")
    assert res.returncode == 1 and "PRL_INSTALLER='conda': use one of uv, pip" in res.stderr


def test_a_flag_in_both_pips_configuration_and_the_arguments_reaches_uv_once(monkeypatch):
    from runners.setup.install import command

    monkeypatch.setenv("PIP_NO_INDEX", "1")
    cmd, _ = command("uv", ["--dry-run", "--no-index", "-r", "requirements.lock"])
    assert cmd.count("--no-index") == 1
    cmd, _ = command("uv", ["-r", "requirements.lock"])
    assert cmd.count("--no-index") == 1  # from pip's configuration alone


def test_an_install_compiles_bytecode_only_when_asked_and_make_writes_what_it_imports(installer, tmp_path):
    """A fresh clone's runtime set-up leaves bytecode to the first import of each module (a minute of
    compiling ~20,000 modules on 2 cores, of which a campaign imports ~5,000), so the Makefile's
    processes must write it even where PYTHONDONTWRITEBYTECODE is set, or every process compiles
    again; the test set's install (``--compile``) compiles ahead."""
    wheel = tmp_path / "prlprobe-1.0-py3-none-any.whl"
    files = {
        "prlprobe/__init__.py": "VALUE = 1\n",
        "prlprobe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: prlprobe\nVersion: 1.0\n",
        "prlprobe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "prlprobe-1.0.dist-info/RECORD"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr(record, "".join(f"{name},,\n" for name in [*files, record]))
    env = {**os.environ, "PRL_INSTALLER": installer}
    for compiled in (False, True):
        target = tmp_path / f"site-{compiled}"
        cmd = [sys.executable, "-m", "runners.setup.install", *(["--compile"] if compiled else [])]
        cmd += ["--no-index", "--no-deps", "--target", str(target), str(wheel)]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        assert res.returncode == 0, res.stdout
        assert (target / "prlprobe/__init__.py").is_file()
        assert (target / "prlprobe/__pycache__").exists() == compiled, f"--compile given: {compiled}"

    package = tmp_path / "site-False/prlprobe"
    probe = f'probe: ; @$(BIN)/python -c "import sys; sys.path.insert(0, {str(package.parent)!r}); import prlprobe"'
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    res = subprocess.run(["make", "-s", f"--eval={probe}", "probe"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stderr
    assert list((package / "__pycache__").glob("__init__.*.pyc")), "make's process wrote no bytecode"

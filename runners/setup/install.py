"""The set-up's installs, with a progress line a person can read: what is being installed, how far
it got, and that it is still working. Run by the Makefile with the new venv's Python, before
anything else is installed: the standard library only.

The installer is `uv <https://docs.astral.sh/uv/>`_ (``uv pip install``) when the venv has it (the
Makefile installs it first, pinned), else pip: the same pinned set either way, uv in seconds where
pip takes minutes. Bytecode is compiled only with ``--compile``, and then only that of the packages
this install installs (the test set's, ~4,600 modules in ~8 s on 2 cores). The runtime set's ~16,000
are not compiled ahead: a campaign imports ~5,000 of them, and the Makefile's processes write the
bytecode of what they import the first time they import it (it unexports
``PYTHONDONTWRITEBYTECODE``), so ``make ablation`` on a fresh clone does not spend a minute first
compiling what it never imports. uv does not read pip's
configuration, so the package sources pip is configured with (``pip config list``: index URLs,
``find-links``, constraints, certificate) are passed on to it, and every index counts alike, as in
pip. ``PRL_INSTALLER=pip`` picks pip.

``python -m runners.setup.install [--compile] [pip install arguments]``; exits with the installer's
code, and on failure prints its last lines.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

HEARTBEAT = 15.0  # seconds without a progress line before saying it is still working
PACKAGE = re.compile(r"^(Collecting|Requirement already satisfied:) ([A-Za-z0-9_.\-\[\]]+)")
UV_STEP = re.compile(r"^(?:(Resolved|Prepared|Uninstalled|Installed|Audited|Checked) \d+ package|Bytecode)")
INSTALLERS = ("uv", "pip")


def pinned(args: list[str]) -> int:
    """How many pinned packages the ``-r`` files of ``args`` name."""
    files = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-r", "--requirement")]
    lines = [line.strip() for f in files for line in Path(f).read_text().splitlines()]
    return sum(1 for line in lines if line and not line.startswith(("#", "-")))


def installer() -> str:
    """``PRL_INSTALLER`` if set, else uv when this Python has it, else pip."""
    name = os.environ.get("PRL_INSTALLER", "")
    if name and name not in INSTALLERS:
        raise SystemExit(f"error: PRL_INSTALLER={name!r}: use one of {', '.join(INSTALLERS)}, or unset it")
    return name or ("uv" if importlib.util.find_spec("uv") else "pip")


def pip_sources() -> tuple[list[str], dict[str, str]]:
    """pip's configured package sources (``pip config list``) as ``uv pip install`` arguments and
    environment: the same indexes, find-links, constraints and certificate for either installer."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    rank = {"global": 0, "install": 1, ":env:": 2}  # pip's precedence: PIP_* over [install] over [global]
    conf: dict[str, str] = {}
    for line in sorted(out.splitlines(), key=lambda line: rank.get(line.split(".", 1)[0], -1)):
        key, _, value = line.partition("=")  # "global.find-links='/opt/wheels'", ":env:.constraint='...'"
        if key.split(".", 1)[0] in rank:
            conf[key.rsplit(".", 1)[-1]] = " ".join(shlex.split(value))
    flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
             "constraint": "--constraint", "trusted-host": "--allow-insecure-host"}  # fmt: skip
    args = [a for key, flag in flags.items() for value in conf.get(key, "").split() for a in (flag, value)]
    if conf.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    env = {"SSL_CERT_FILE": conf["cert"]} if conf.get("cert") else {}
    return args, env


def command(name: str, args: list[str], *, compile_bytecode: bool = False) -> tuple[list[str], dict[str, str]]:
    """The install command line for installer ``name`` and its environment; ``compile_bytecode``: of
    the packages it installs."""
    if name == "pip":
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off"]
        cmd += [] if compile_bytecode else ["--no-compile"]
        return [*cmd, *args], dict(os.environ)
    sources, env = pip_sources()
    cmd = [sys.executable, "-m", "uv", "pip", "install", "--python", sys.executable, "--color", "never"]
    cmd += ["--no-progress", "--index-strategy", "unsafe-best-match"]
    cmd += ["--compile-bytecode"] if compile_bytecode else []
    sources = [a for a in sources if a != "--no-index" or a not in args]  # uv takes a flag once
    return [*cmd, *sources, *args], {**os.environ, **env}


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"


def install(args: list[str], say=print, *, compile_bytecode: bool = False) -> int:
    """Install ``args`` (``pip install`` arguments) and report its progress; the installer's exit code."""
    name, total = installer(), pinned(args)
    files = " + ".join(args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-r", "--requirement"))
    say(f"installing {total} pinned package(s) from {files} into {sys.prefix} ({name})")
    cmd, env = command(name, args, compile_bytecode=compile_bytecode)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.put(line.rstrip())
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    start = last = time.monotonic()
    seen, tail, phase = 0, [], "resolving"
    while True:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            line = ""
        if line is None:
            break
        now = time.monotonic()
        if line:
            tail = [*tail[-30:], line]
            match = PACKAGE.match(line)
            step = UV_STEP.match(line)  # uv: "Resolved 207 packages in 1.2s", "Installed 207 packages in 5.1s"
            if step:
                say(f"  {line}")
                phase = "compiling bytecode" if step.group(1) == "Installed" and compile_bytecode else phase
                last = now
            elif match:
                seen += 1
                if now - last >= HEARTBEAT / 3 or seen == total:
                    done = f"{min(seen, total)}/{total}"
                    say(f"  {done} checked or downloaded ({match.group(2)}), {_duration(now - start)}")
                    last = now
            elif line.startswith("Installing collected packages:"):
                phase = "installing"
                count = len(line.split(":", 1)[1].split(","))
                say(f"  installing {count} package(s) (torch takes the longest), {_duration(now - start)}")
                last = now
        if now - last >= HEARTBEAT:
            say(f"  still {phase} ({_duration(now - start)})")
            last = now
    code = proc.wait()
    if code:
        say(f"{name} failed; its last lines:\n" + "\n".join(tail[-20:]))
    else:
        say(f"installed in {_duration(time.monotonic() - start)}")
    return code


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    compile_bytecode = "--compile" in args
    args = [a for a in args if a != "--compile"]
    return install(args, say=lambda m: print(m, flush=True), compile_bytecode=compile_bytecode)


if __name__ == "__main__":
    sys.exit(main())

"""``pip install`` with a progress line a person can read: what is being installed, how far it got,
and that it is still working (a first install of the pinned set takes minutes, quiet pip says
nothing until the end). Run by the Makefile with the new venv's Python, before anything else is
installed: the standard library only.

``python -m runners.ops.install [pip install arguments]``; exits with pip's code, and on failure
prints pip's last lines.
"""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

HEARTBEAT = 15.0  # seconds without a progress line before saying it is still working
PACKAGE = re.compile(r"^(Collecting|Requirement already satisfied:) ([A-Za-z0-9_.\-\[\]]+)")


def pinned(args: list[str]) -> int:
    """How many pinned packages the ``-r`` files of ``args`` name."""
    files = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-r", "--requirement")]
    lines = [line.strip() for f in files for line in Path(f).read_text().splitlines()]
    return sum(1 for line in lines if line and not line.startswith(("#", "-")))


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"


def install(args: list[str], say=print) -> int:
    """Run ``pip install ARGS`` and report its progress; returns pip's exit code."""
    total = pinned(args)
    files = " + ".join(args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-r", "--requirement"))
    say(f"installing {total} pinned package(s) from {files} into {sys.prefix} (pip; minutes on a first install)")
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
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
            if match:
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
        say("pip failed; its last lines:\n" + "\n".join(tail[-20:]))
    else:
        say(f"installed in {_duration(time.monotonic() - start)}")
    return code


def main(argv: list[str] | None = None) -> int:
    return install(list(sys.argv[1:] if argv is None else argv), say=lambda m: print(m, flush=True))


if __name__ == "__main__":
    sys.exit(main())

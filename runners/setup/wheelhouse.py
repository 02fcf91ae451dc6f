"""A reproducible wheel set for air-gapped machines (clusters, the lent GPU box).

The set is the runtime closure of the project's dependencies, pinned to ``requirements.lock`` and
``requirements-full.lock`` (the tested versions; the second pins ray, for ``--with ray``), minus
what the target already provides: torch always (its build is the cluster's CUDA choice) and,
optionally, every package named in a ``provided`` file (one name per line, ``pip freeze`` output
works) except those in ``always`` (the HF/RL stack, whose versions must match the lock). Wheels
are fetched for the target's Python and platform, so they can be built here and installed there
with ``pip install --no-index --no-deps --target DIR wheels/*.whl``.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOTS = ["trl", "transformers", "tokenizers", "datasets", "accelerate", "mlflow", "math-verify"]
ROOTS += ["scipy", "numpy", "pandas", "matplotlib", "pyyaml", "psutil", "peft"]
# rouge-score (the rouge_l reward) ships as a source archive only: install it where it is needed
NEVER = {"torch", "triton"}  # the target's own CUDA build
ALWAYS = {"trl", "transformers", "tokenizers", "huggingface-hub", "hf-xet", "datasets"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
PLATFORMS += ("manylinux1_x86_64", "manylinux_2_24_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(*paths: Path) -> dict[str, str]:
    """``{name: version}`` of every pin in the given lock files."""
    pins = {}
    for path in paths:
        for line in path.read_text().splitlines():
            line = line.split("#")[0].strip()
            if "==" in line:
                name, version = line.split("==", 1)
                pins[norm(name)] = version.strip()
    return pins


def read_names(path: Path) -> set[str]:
    """Package names in a requirements / ``pip freeze`` / one-name-per-line file."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            names.add(norm(re.split(r"[=<>~! \[;@]", line, maxsplit=1)[0]))
    return names


def closure(roots: tuple[str, ...] | list[str] = tuple(ROOTS)) -> set[str]:
    """Names of the installed distributions ``roots`` need at run time (extras off)."""
    seen: set[str] = set()
    stack = [norm(r) for r in roots]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in NEVER:  # the target's torch brings its own needs
            continue
        try:
            requires = md.distribution(name).requires or []
        except md.PackageNotFoundError as e:
            raise SystemExit(f"wheels: {name} is not installed here; run `make setup` first") from e
        for spec in requires:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                stack.append(norm(req.name))
    return seen


def select(
    lock: dict[str, str], provided: set[str], always: set[str] = ALWAYS, extra: tuple[str, ...] = ()
) -> list[str]:
    """``name==version`` pins to download: the closure, less torch and what the target provides."""
    pins = []
    for name in sorted(closure([*ROOTS, *extra])):
        if name in NEVER or (name in provided and name not in always):
            continue
        if name not in lock:
            raise SystemExit(f"wheels: {name} is needed but not pinned in the lock files")
        pins.append(f"{name}=={lock[name]}")
    return pins


def download(pins: list[str], out: Path, python: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):
        if not any(old.name.lower().startswith(p.split("==")[0].replace("-", "_") + "-") for p in pins):
            old.unlink()  # a wheel from an earlier, different selection
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
    cmd += ["--only-binary=:all:", "--python-version", python, "--implementation", "cp", "-d", str(out)]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    subprocess.run(cmd + pins, check=True)
    (out / "requirements.txt").write_text("\n".join(pins) + "\n")


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m runners.setup.wheelhouse",
        description="Download the project's pinned runtime wheels for an offline machine.",
    )
    p.add_argument("--out", type=Path, default=Path("wheels"), help="folder for the wheels (default: wheels/)")
    p.add_argument("--python", default="3.12", help="the target's Python version (default: 3.12)")
    p.add_argument(
        "--lock",
        type=Path,
        nargs="+",
        default=[Path("requirements.lock"), Path("requirements-full.lock")],
        help="pinned versions (default: requirements.lock requirements-full.lock)",
    )
    p.add_argument(
        "--provided",
        type=Path,
        help="file naming the packages the target already has (pip freeze output works); "
        "they are left out, except the HF/RL stack (" + ", ".join(sorted(ALWAYS)) + ")",
    )
    p.add_argument(
        "--with",
        dest="extra",
        action="append",
        default=[],
        help="also these packages and their needs, e.g. --with ray for a Ray cluster, --with psycopg2-binary",
    )
    args = p.parse_args(argv)
    provided = read_names(args.provided) if args.provided else set()
    pins = select(read_lock(*args.lock), provided, extra=tuple(args.extra))
    print(f"{len(pins)} wheels for Python {args.python} → {args.out}/", flush=True)
    download(pins, args.out, args.python)
    size = sum(f.stat().st_size for f in args.out.glob("*.whl")) / 2**20
    print(f"{len(list(args.out.glob('*.whl')))} wheels, {size:.1f} MiB; install on the target with:")
    print(f"  python3 -m pip install --no-index --no-deps --target /path/site {args.out}/*.whl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

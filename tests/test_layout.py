"""The runners package by concern: its modules import one way (no cycle, imports inside functions and
type-only ones included), each concern imports nothing from the concerns above it, and no module
imports a private name of another. Read from the code's own imports (``ast``); nothing is run."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# each part of runners, and the parts above it, which it must not import
ABOVE = {
    "runners.setup": ("runners.",),  # run before anything is installed: the standard library only
    "runners.task": ("runners.rl", "runners.campaign", "runners.tracking", "runners.launch", "runners.cli"),
    "runners.rl": ("runners.campaign", "runners.tracking", "runners.locks", "runners.launch", "runners.cli"),
    "runners.locks": ("runners.campaign", "runners.tracking", "runners.launch", "runners.cli"),
    "runners.tracking": ("runners.campaign", "runners.launch", "runners.cli"),
    "runners.campaign": ("runners.launch", "runners.cli"),
    "runners.launch": ("runners.campaign", "runners.cli"),
}


def _modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of runners by its dotted name (a package by its ``__init__``'s)."""
    out = {}
    for path in sorted((root / "runners").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """The runners modules ``path`` imports (anywhere in it), each with the names it takes."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("runners")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("runners"):
            for a in node.names:  # ``from runners.tracking import store``: the module store
                sub = f"{node.module}.{a.name}"
                found.append((sub, []) if sub in modules else (node.module, [a.name]))
    return found


def _graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = _modules(root)
    return {name: {m for m, _ in _imports(path, modules) if m in modules} - {name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each module that lies on one (depth-first)."""
    cycles, done = [], set()

    def visit(node: str, stack: list[str]) -> None:
        if node in stack:
            cycles.append([*stack[stack.index(node) :], node])
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*stack, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return cycles


def test_no_module_of_runners_lies_on_an_import_cycle():
    assert not _cycles(_graph()), _cycles(_graph())


def test_the_cycle_finder_finds_a_cycle(tmp_path):
    """The finder itself, on a planted two-module cycle (imports inside a function and type-only
    ones count: they tie the modules all the same)."""
    pkg = tmp_path / "runners" / "campaign"
    pkg.mkdir(parents=True)
    (tmp_path / "runners" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "spec.py").write_text("from runners.campaign.load import expand\n")
    (pkg / "load.py").write_text("def f():\n    from runners.campaign import spec\n")
    assert _cycles(_graph(tmp_path)) == [["runners.campaign.load", "runners.campaign.spec", "runners.campaign.load"]]


def test_each_concern_imports_nothing_from_the_concerns_above_it():
    modules = _modules()
    wrong = [
        f"{name} imports {used}"
        for name, path in modules.items()
        for part, above in ABOVE.items()
        if name == part or name.startswith(part + ".")
        for used, _ in _imports(path, modules)
        if used.startswith(above)
    ]
    assert not wrong, wrong


def test_no_module_of_runners_imports_a_private_name_of_another():
    modules = _modules()
    private = [
        f"{name}: {used}.{n}"
        for name, path in modules.items()
        for used, names in _imports(path, modules)
        for n in names
        if n.startswith("_")
    ]
    assert not private, private

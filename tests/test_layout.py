"""The runners and scalefit packages by concern: their modules import one way (no cycle, imports inside functions and
type-only ones included), each concern imports nothing from the concerns above it, and no module of
the project (runners, scalefit, analysis, tests) uses a private name of another. Read from the code's
own imports (``ast``); nothing is run."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# each part of runners, and the parts above it, which it must not import
ABOVE = {
    "runners.setup": ("runners.",),  # run before anything is installed: the standard library only
    "runners.parent_death": ("runners.",),  # the standard library only: servers and trainers share it
    "runners.task": ("runners.rl", "runners.campaign", "runners.tracking", "runners.launch", "runners.cli"),
    "runners.rl": ("runners.campaign", "runners.tracking", "runners.locks", "runners.launch", "runners.cli"),
    "runners.locks": ("runners.campaign", "runners.tracking", "runners.launch", "runners.cli"),
    "runners.tracking": ("runners.campaign", "runners.launch", "runners.cli"),
    "runners.campaign": ("runners.launch", "runners.cli"),
    "runners.launch": ("runners.campaign", "runners.cli"),
}


def _modules(root: Path = ROOT, packages: tuple[str, ...] = ("runners",)) -> dict[str, Path]:
    """Every module of ``packages`` by its dotted name (a package by its ``__init__``'s)."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, modules: dict[str, Path], package: str = "runners") -> list[tuple[str, list[str]]]:
    """The ``package`` modules ``path`` imports (anywhere in it), each with the names it takes."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith(package)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package):
            for a in node.names:  # ``from runners.tracking import store``: the module store
                sub = f"{node.module}.{a.name}"
                found.append((sub, []) if sub in modules else (node.module, [a.name]))
    return found


def _graph(root: Path = ROOT, package: str = "runners") -> dict[str, set[str]]:
    modules = _modules(root, (package,))
    return {
        name: {m for m, _ in _imports(path, modules, package) if m in modules} - {name}
        for name, path in modules.items()
    }


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


# scalefit's rooms, lowest first: a module imports its own room and the rooms below it, never one above
# or beside it (a module of scalefit in no room fails: place it)
SCALEFIT_FLOORS = (
    # shared by every room: the standard library and numpy only (errors, defaults, reasons as data, the margin ladder)
    ("scalefit.errors", "scalefit.defaults", "scalefit.reasons", "scalefit.ladder"),
    ("scalefit.models",),  # curve forms, their fits, the registry by name
    ("scalefit.data",),  # curves read, results written, unstable runs, synthetic curves
    ("scalefit.forecasts",),  # bands, backtests, verdicts, calls
    ("scalefit.decide",),  # comparisons, early stops, calls from the data alone
    ("scalefit.sizes",),  # across model size
    ("scalefit.cli",),  # the command line
    ("scalefit.__main__",),  # `python -m scalefit`
    ("scalefit",),  # the public API: its __init__ re-exports the rooms' names
)


def _room(module: str) -> tuple[int, str] | None:
    """(floor, room) of a scalefit module: the room that is its longest dotted prefix (the package's
    own ``__init__``, ``scalefit``, is a room of that module alone)."""
    rooms = [(floor, room) for floor, names in enumerate(SCALEFIT_FLOORS) for room in names]
    found = [(f, r) for f, r in rooms if module == r or ("." in r and module.startswith(r + "."))]
    return max(found, key=lambda fr: len(fr[1])) if found else None


def _upward_arrows(root: Path = ROOT) -> list[str]:
    """Every import of a scalefit module (inside functions included) that points to a room above its
    own or beside it, and every module in no room."""
    wrong = []
    for name, used in sorted(_graph(root, "scalefit").items()):
        here = _room(name)
        if here is None:
            wrong.append(f"{name} is in no room of SCALEFIT_FLOORS")
            continue
        for other in sorted(used):
            there = _room(other)
            if there is not None and there[1] != here[1] and there[0] >= here[0]:
                wrong.append(f"{name} imports {other}, a room {'beside' if there[0] == here[0] else 'above'} its own")
    return wrong


def test_no_module_of_scalefit_lies_on_an_import_cycle():
    assert not _cycles(_graph(ROOT, "scalefit")), _cycles(_graph(ROOT, "scalefit"))


def test_each_room_of_scalefit_imports_only_itself_and_the_rooms_below_it():
    """models <- data <- forecasts <- decide <- sizes <- cli (issue 61): no arrow points up."""
    assert not _upward_arrows(), _upward_arrows()


def test_the_room_check_finds_an_upward_arrow_and_a_cycle(tmp_path):
    """The checks themselves, on planted code: a model importing a forecast inside a function is an
    arrow upwards, and with the forecast importing it back, a cycle; a module in no room is named."""
    for room in ("models", "forecasts"):
        (tmp_path / "scalefit" / room).mkdir(parents=True)
        (tmp_path / "scalefit" / room / "__init__.py").write_text("")
    (tmp_path / "scalefit" / "__init__.py").write_text("")
    (tmp_path / "scalefit" / "models" / "curve.py").write_text("def f():\n    from scalefit.forecasts import band\n")
    (tmp_path / "scalefit" / "forecasts" / "band.py").write_text("import scalefit.models.curve\n")
    (tmp_path / "scalefit" / "loose.py").write_text("")
    assert _upward_arrows(tmp_path) == [
        "scalefit.loose is in no room of SCALEFIT_FLOORS",
        "scalefit.models.curve imports scalefit.forecasts.band, a room above its own",
    ]
    assert _cycles(_graph(tmp_path, "scalefit")) == [
        ["scalefit.forecasts.band", "scalefit.models.curve", "scalefit.forecasts.band"]
    ]


PACKAGES = ("runners", "scalefit", "analysis", "tests")  # the project's own modules


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _absolute(node: ast.ImportFrom, name: str, path: Path) -> str:
    """The module ``node`` imports from, a relative import resolved against module ``name``."""
    if not node.level:
        return node.module or ""
    parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    return ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])


def _import_module(expr: ast.expr) -> str | None:
    """The module ``expr`` imports, where it is ``importlib.import_module("m")``."""
    if not isinstance(expr, ast.Call) or getattr(expr.func, "attr", getattr(expr.func, "id", "")) != "import_module":
        return None
    first = expr.args[0] if expr.args else None
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _private_uses(name: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """Where module ``name`` uses a private name of another project module: ``from m import _x``,
    ``m._x`` (``m`` bound to the module by an import or ``importlib.import_module``) and
    ``setattr(m, "_x", ...)``."""
    tree = ast.parse(path.read_text())
    bound: dict[str, str] = {}  # a local name -> the project module it is bound to
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PACKAGES:
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node, name, path)
            if source.split(".")[0] not in PACKAGES:
                continue
            for a in node.names:
                if f"{source}.{a.name}" in modules:
                    bound[a.asname or a.name] = f"{source}.{a.name}"
                if _private(a.name) and source != name:
                    found.append((node.lineno, f"{name}:{node.lineno} imports {source}.{a.name}"))
        elif isinstance(node, ast.Assign) and (imported := _import_module(node.value)) in modules:
            bound[getattr(node.targets[0], "id", "")] = imported

    def module_of(expr: ast.expr) -> str | None:
        chain = []
        while isinstance(expr, ast.Attribute):
            chain.append(expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name) or expr.id not in bound:
            return None
        dotted = ".".join([bound[expr.id], *reversed(chain)])
        return dotted if dotted in modules and dotted != name else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and (used := module_of(node.value)):
            found.append((node.lineno, f"{name}:{node.lineno} uses {used}.{node.attr}"))
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            attr, callee = node.args[1].value, node.func
            setter = getattr(callee, "attr", getattr(callee, "id", "")) in ("setattr", "getattr", "delattr")
            if setter and isinstance(attr, str) and _private(attr) and (used := module_of(node.args[0])):
                found.append((node.lineno, f"{name}:{node.lineno} uses {used}.{attr}"))
    return [use for _, use in sorted(found)]


def _private_names_used(root: Path = ROOT) -> list[str]:
    modules = _modules(root, PACKAGES)
    return [use for name, path in modules.items() for use in _private_uses(name, path, modules)]


def test_no_module_of_the_project_uses_a_private_name_of_another():
    """A name shared between modules is public where it is defined (a shared test helper lives in
    tests/conftest.py)."""
    assert not _private_names_used(), _private_names_used()


def test_the_private_name_finder_finds_each_form(tmp_path):
    """The finder itself, on planted uses: imported (absolute and relative), read as an attribute of
    an imported module, and patched by name; a module's own private names and dunders are not uses."""
    pkg = tmp_path / "scalefit"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .fit import _chunks\n")
    (pkg / "fit.py").write_text("def _chunks():\n    pass\n\n_chunks()\nprint(__name__)\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "import scalefit.fit\nfrom scalefit import fit as f\nfrom scalefit.fit import _chunks\n"
        "scalefit.fit._chunks()\nf._chunks()\nf.__file__\n"
        "def test(monkeypatch):\n    monkeypatch.setattr(f, '_chunks', None)\n"
        "import importlib\nm = importlib.import_module('scalefit.fit')\nm._chunks()\n"
    )
    assert _private_names_used(tmp_path) == [
        "scalefit:1 imports scalefit.fit._chunks",
        "tests.test_x:3 imports scalefit.fit._chunks",
        "tests.test_x:4 uses scalefit.fit._chunks",
        "tests.test_x:5 uses scalefit.fit._chunks",
        "tests.test_x:8 uses scalefit.fit._chunks",
        "tests.test_x:11 uses scalefit.fit._chunks",
    ]


MAX_LINES = 70  # a function of the project's logic, its docstring included
ARGUMENT_TABLES = ("build_parser", "add_parser")  # argparse tables: an option a line, no logic to split
# whole because its code is hashed into every base model's build key (basemodel.build_fingerprint, checked
# by tests/test_embedded.py): split, every cached base model and the runs on it would change identity
FINGERPRINTED = {("runners/task/basemodel.py", "_build")}


def _function_lengths(root: Path = ROOT) -> list[tuple[str, str, int, int]]:
    """(path, name, first line, lines) of every function and method in runners, scalefit and analysis."""
    out = []
    for path in _modules(root, ("runners", "scalefit", "analysis")).values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                rel = path.relative_to(root).as_posix()
                out.append((rel, node.name, node.lineno, node.end_lineno - node.lineno + 1))
    return out


def _long_functions(root: Path = ROOT) -> list[str]:
    return [
        f"{path}:{line} {name} ({n} lines)"
        for path, name, line, n in _function_lengths(root)
        if n > MAX_LINES and name not in ARGUMENT_TABLES and (path, name) not in FINGERPRINTED
    ]


def test_no_function_of_the_project_runs_over_70_lines():
    """Short functions where they carry logic (#43): one over 70 lines is split into named helpers."""
    assert not _long_functions(), f"split these (at most {MAX_LINES} lines each): {_long_functions()}"


def test_each_function_left_whole_is_still_long_and_fingerprinted():
    """An exemption lapses once its function is short, or no longer hashed into the build key."""
    lengths = {(path, name): n for path, name, _, n in _function_lengths()}
    for path, name in FINGERPRINTED:
        assert lengths.get((path, name), 0) > MAX_LINES, f"{path} {name} is short now: drop its exemption"
        hashing = next(
            n for n in ast.parse((ROOT / path).read_text()).body if getattr(n, "name", "") == "build_fingerprint"
        )
        names = {n.value for n in ast.walk(hashing) if isinstance(n, ast.Constant)}
        assert name in names, f"build_fingerprint no longer hashes {name}: drop its exemption"


def test_the_long_function_finder_finds_one(tmp_path):
    """The finder itself, on planted code: a 71-line function and method are named; a 70-line one and
    an argument table are not."""
    (tmp_path / "scalefit").mkdir()

    def function(name: str, lines: int, indent: str = "") -> str:
        return f"{indent}def {name}():\n" + f"{indent}    x = 1\n" * (lines - 1) + "\n\n"

    code = function("long", 71) + function("fits", 70) + function("build_parser", 90)
    (tmp_path / "scalefit" / "m.py").write_text(code + "class C:\n" + function("method", 71, "    "))
    assert _long_functions(tmp_path) == ["scalefit/m.py:1 long (71 lines)", "scalefit/m.py:239 method (71 lines)"]

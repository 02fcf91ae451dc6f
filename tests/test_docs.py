"""The docs name only what exists: every `make` target and every flag of a `python -m runners|analysis|scalefit`
command written in the README, docs/ and results/README.md is one the Makefile or the command's parser has."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "results" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = re.compile(r"```[a-z]*\n(.*?)```|`([^`\n]+)`", re.DOTALL)


def _snippets(page: Path) -> list[str]:
    """Code spans and code blocks of a page, a block's continued lines joined."""
    out = []
    for block, span in CODE.findall(page.read_text()):
        text = (block or span).replace("\\\n", " ")
        out += [line.split("#", 1)[0] for line in text.splitlines()]
    return out


def _commands(page: Path) -> list[str]:
    """The snippets that are commands: code blocks' lines, and spans that start with ``make``."""
    return [line for line in _snippets(page) if line.lstrip().startswith(("make ", "$ make ")) or "&&" in line]


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from analysis.cli import build_parser as analysis_parser
    from runners.cli import build_parser as runners_parser
    from scalefit.cli import build_parser as scalefit_parser

    return {"runners": runners_parser(), "analysis": analysis_parser(), "scalefit": scalefit_parser()}


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:  # noqa: SLF001 - argparse keeps sub-commands only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return action.choices.get(command)
    return None


def test_pages_exist_and_readme_is_short() -> None:
    for page in PAGES:
        assert page.is_file(), page
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_every_make_target_named_in_the_docs_exists() -> None:
    targets = _make_targets()
    missing = set()
    for page in PAGES:
        for line in _commands(page):
            for name in re.findall(r"(?:^|[;&|(]\s*)make ([a-z][a-z0-9-]*)", line.strip()):
                if name not in targets:
                    missing.add(f"{page.relative_to(ROOT)}: make {name}")
    assert not missing, sorted(missing)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cli_flag_named_in_the_docs_exists(page: Path) -> None:
    parsers = _parsers()
    missing = []
    for line in _snippets(page):
        for tool, rest in re.findall(r"python3? -m (runners|analysis|scalefit)\b([^;&|]*)", line):
            words = rest.split()
            if not words or "…" in words[0]:  # a placeholder: `python -m runners …`
                continue
            sub = _subparser(parsers[tool], words[0])
            if sub is None:
                if not words[0].startswith("-"):
                    missing.append(f"python -m {tool} {words[0]}")
                continue
            known = {opt for a in sub._actions for opt in a.option_strings}  # noqa: SLF001
            for flag in (w.split("=", 1)[0] for w in words[1:] if w.startswith("--")):
                if flag not in known and not flag.startswith("--…"):
                    missing.append(f"python -m {tool} {words[0]} {flag}")
    assert not missing, f"{page.relative_to(ROOT)} names what does not exist: {sorted(set(missing))}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_opens(page: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if "://" in target or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links to nothing: {broken}"

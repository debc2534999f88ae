"""The package's shape (docs/layout.md): its layers as pyproject.toml's import-linter contracts say,
no import cycle, a top level of the entry points and the user's files only, no module over 300 lines
(but the training loop's), no Jinja left in a module; and tests/ as its mirror, each module's unit
test file at the module's path."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
PACKAGE = PROJECT / "{{cookiecutter.package_name}}"
TESTS = PROJECT / "tests"
MOST_LINES = 300
LONGER = {"{{cookiecutter.package_name}}.engine.trainer"}  # the loop and its step, read in one sitting (docs/layout.md)
# The top level: the entry points (the top layer of pyproject.toml's layers contract) and the user's files; the
# machinery is in folders named after their layer.
TOP_LAYER = re.search(r'layers = \[\s*"([^"]+)"', (PROJECT / "pyproject.toml").read_text())
assert TOP_LAYER, "pyproject.toml's layers contract, whose first layer is the entry points"
ENTRY_POINTS = {name.strip() for name in TOP_LAYER.group(1).split("|")}
USERS_FILES = {"models", "tasks", "augment", "callbacks"}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PROJECT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports, at any depth of its code."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.ImportFrom):
            base = name.split(".") if is_package else name.split(".")[:-1]
            if node.level:
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            targets = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def test_the_layer_contracts_hold() -> None:
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    proc = subprocess.run([lint_imports, "--no-cache"], cwd=PROJECT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "0 broken" in proc.stdout and "3 kept" in proc.stdout, proc.stdout[-2000:]


def test_no_import_cycle() -> None:
    known = modules()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    for start in graph:  # a path from a module back to itself
        seen, frontier = set(), list(graph[start])
        while frontier:
            node = frontier.pop()
            assert node != start, f"{start} imports itself through {sorted(seen)}"
            if node not in seen:
                seen.add(node)
                frontier.extend(graph[node])


def test_the_top_level_holds_the_entry_points_and_the_users_files_only() -> None:
    top = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    assert top <= ENTRY_POINTS | USERS_FILES, f"put {sorted(top - ENTRY_POINTS - USERS_FILES)} in its layer's folder"
    assert len(top) <= 10


def test_no_module_is_over_300_lines_or_holds_jinja() -> None:
    for name, path in modules().items():
        text = path.read_text()
        if name not in LONGER:
            assert len(text.splitlines()) <= MOST_LINES, f"{name}: {len(text.splitlines())} lines; split it by concern"
        block, comment = "{" + "%", "{" + "#"  # spelled apart: this file is a template too
        assert block not in text and comment not in text, f"{name} holds template logic: use a registry and the hook"


def unit_test_file(module: Path) -> Path | None:
    """Where a module's unit tests are: PACKAGE/a/b/c.py in tests/a/b/test_c.py; a package's __init__.py
    with code of its own (a def or a class) in tests/<its folder>/test_<folder>.py, the top one's in
    tests/test_package.py. None for launch/__main__.py and an __init__.py of imports and constants only."""
    relative = module.relative_to(PACKAGE)
    if relative == Path("launch", "__main__.py"):
        return None
    if module.name != "__init__.py":
        return TESTS / relative.parent / f"test_{module.stem}.py"
    if relative.parent == Path():
        return TESTS / "test_package.py"
    code = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    if not any(isinstance(node, code) for node in ast.parse(module.read_text()).body):
        return None
    return TESTS / relative.parent / f"test_{relative.parent.name}.py"


def test_every_module_has_its_unit_test_file() -> None:
    # A bake without an option lacks the option's modules and their test files alike.
    missing = [
        f"{module.relative_to(PROJECT)}: {test.relative_to(PROJECT)}"
        for module in sorted(PACKAGE.rglob("*.py"))
        if (test := unit_test_file(module)) is not None and not test.is_file()
    ]
    assert not missing, "modules without their unit test file: " + "; ".join(missing)

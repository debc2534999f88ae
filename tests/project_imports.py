"""What a baked project's Python files import of its own code (its package and its tests), read from their source:
every `import` and `from ... import` at any depth of the code (a function's own too, which collecting the tests
never runs), each checked to name a module the bake holds, or a name that module defines."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SKIPPED = {".venv", "__pycache__", ".git", "outputs", ".pytest_cache", ".ruff_cache", ".mypy_cache"}


def module_name(project: Path, path: Path) -> str:
    parts = path.relative_to(project).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_file(project: Path, name: str) -> Path | None:
    base = project.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def top_level_names(tree: ast.Module) -> set[str] | None:
    """The names a module binds at its top level (in its `if`/`try`/`with` blocks too); None where it binds names
    that cannot be read off its source (a star import, a module `__getattr__`)."""
    names: set[str] = set()
    blocks = [tree.body]
    while blocks:
        for node in blocks.pop():
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if node.name == "__getattr__":
                    return None
                names.add(node.name)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                if any(alias.name == "*" for alias in node.names):
                    return None
                names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
                blocks += [getattr(node, field) for field in ("body", "orelse", "finalbody") if hasattr(node, field)]
                blocks += [handler.body for handler in getattr(node, "handlers", [])]
    return names


def imports_of(project: Path, path: Path, own: set[str]) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, name or None) for each import of `path` that names the project's own code."""
    name, is_package = module_name(project, path), path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in own:
                    yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module.split(".")[0] in own:
                for alias in node.names:
                    yield node.lineno, module, alias.name


def unresolved_imports(project: Path, package: str) -> list[str]:
    """`file:line: ...` for each import of the project's own code that names what the bake does not hold."""
    own = {package, "tests"}
    names: dict[str, set[str] | None] = {}
    missing = []
    for path in sorted(project.rglob("*.py")):
        if SKIPPED & set(path.relative_to(project).parts):
            continue
        for line, module, name in imports_of(project, path, own):
            where = f"{path.relative_to(project)}:{line}"
            found = module_file(project, module)
            if found is None:
                missing.append(f"{where}: no module {module}")
                continue
            if name is None or name == "*" or module_file(project, f"{module}.{name}") is not None:
                continue
            if module not in names:
                names[module] = top_level_names(ast.parse(found.read_text()))
            if names[module] is not None and name not in names[module]:
                missing.append(f"{where}: {module} defines no {name}")
    return missing

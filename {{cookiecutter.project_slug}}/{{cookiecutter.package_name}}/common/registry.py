"""Members found by what is present: a package (models/, tasks/, datasets/) whose optional parts are modules
of their own, each with a `BUILDABLE` tuple. A project made without one (cookiecutter's options) simply lacks the
file; nothing names it, and its old name `<package>.<Name>` (configs, saved checkpoints) keeps working
where it is present."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from typing import Any


def buildable_beside(package: str, path: Iterable[str]) -> tuple[Any, ...]:
    """Every `BUILDABLE` of the modules of `package` (its `__path__`), in name order."""
    found: list[Any] = []
    for info in sorted(pkgutil.iter_modules(path), key=lambda info: info.name):
        found += getattr(importlib.import_module(f"{package}.{info.name}"), "BUILDABLE", ())
    return tuple(found)


def member(buildable: Iterable[Any], package: str, name: str) -> Any:
    """`package.<name>` for a member of a module beside it (a module's `__getattr__`, PEP 562)."""
    for item in buildable:
        if getattr(item, "__name__", None) == name:
            return item
    raise AttributeError(f"module {package!r} has no attribute {name!r}")


def defined_beside(package: str, path: Iterable[str], name: str) -> Any:
    """`package.<name>` for a public function or class defined in a module of `package` (a module's
    `__getattr__`, PEP 562): the first such module in name order."""
    if not name.startswith("_"):
        for info in sorted(pkgutil.iter_modules(path), key=lambda info: info.name):
            module = importlib.import_module(f"{package}.{info.name}")
            found = vars(module).get(name)
            if found is not None and getattr(found, "__module__", None) == module.__name__:
                return found
    raise AttributeError(f"module {package!r} has no attribute {name!r}")

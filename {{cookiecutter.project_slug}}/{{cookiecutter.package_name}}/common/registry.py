"""Members found by what is present: a package (models/, tasks/, datasets/) whose optional parts are modules
of their own, each with a `BUILDABLE` tuple. A project made without one simply lacks the file, and its name
`<package>.<Name>` (configs, saved checkpoints, imports) keeps working where it is present."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any


def modules_with(package: str, path: Iterable[str], marker: str) -> tuple[ModuleType, ...]:
    """The modules of `package` (its `__path__`) whose source names `marker`, imported, in name order; looked
    for once. A module that does not is left alone: a command run as `python -m` must not be imported first."""
    return _modules_with(package, tuple(path), marker)


@functools.cache
def _modules_with(package: str, path: tuple[str, ...], marker: str) -> tuple[ModuleType, ...]:
    found = []
    for info in sorted(pkgutil.iter_modules(path), key=lambda info: info.name):
        spec = importlib.util.find_spec(f"{package}.{info.name}")
        if spec is not None and spec.origin and marker in Path(spec.origin).read_text(encoding="utf-8"):
            found.append(importlib.import_module(f"{package}.{info.name}"))
    return tuple(found)


def buildable_beside(package: str, path: Iterable[str]) -> tuple[Any, ...]:
    """Every `BUILDABLE` of the modules of `package` (its `__path__`), in name order."""
    modules = modules_with(package, path, "BUILDABLE")
    return tuple(item for module in modules for item in getattr(module, "BUILDABLE", ()))


def defined_beside(package: str, path: Iterable[str], name: str) -> Any:
    """`package.<name>` for a public function or class defined in a module of `package` that registers
    something (a module's `__getattr__`, PEP 562): the first such module in name order."""
    if not name.startswith("_"):
        for module in modules_with(package, path, "BUILDABLE"):
            found = vars(module).get(name)
            if found is not None and getattr(found, "__module__", None) == module.__name__:
                return found
    raise AttributeError(f"module {package!r} has no attribute {name!r}")

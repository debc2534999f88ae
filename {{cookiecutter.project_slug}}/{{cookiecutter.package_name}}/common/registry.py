"""Members found by what is present: a package (models/, tasks/, datasets/) whose optional parts are
modules of their own, each with a `BUILDABLE` tuple. A project made without one (cookiecutter's options)
simply lacks the file; nothing names it, and its old name `<package>.<Name>` (configs, saved checkpoints)
keeps working where it is present."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any


def registering(package: str, path: Iterable[str]) -> Iterator[ModuleType]:
    """The modules of `package` (its `__path__`) that register something (a `BUILDABLE` in their source),
    imported, in name order. One that registers nothing is left alone: a command run as `python -m` must
    not be imported by its package before it runs."""
    for info in sorted(pkgutil.iter_modules(path), key=lambda info: info.name):
        spec = importlib.util.find_spec(f"{package}.{info.name}")
        if spec is not None and spec.origin and "BUILDABLE" in Path(spec.origin).read_text(encoding="utf-8"):
            yield importlib.import_module(f"{package}.{info.name}")


def buildable_beside(package: str, path: Iterable[str]) -> tuple[Any, ...]:
    """Every `BUILDABLE` of the modules of `package` (its `__path__`), in name order."""
    return tuple(item for module in registering(package, path) for item in getattr(module, "BUILDABLE", ()))


def member(buildable: Iterable[Any], package: str, name: str) -> Any:
    """`package.<name>` for a member of a module beside it (a module's `__getattr__`, PEP 562)."""
    for item in buildable:
        if getattr(item, "__name__", None) == name:
            return item
    raise AttributeError(f"module {package!r} has no attribute {name!r}")


def defined_beside(package: str, path: Iterable[str], name: str) -> Any:
    """`package.<name>` for a public function or class defined in a module of `package` that registers
    something (a module's `__getattr__`, PEP 562): the first such module in name order."""
    if not name.startswith("_"):
        for module in registering(package, path):
            found = vars(module).get(name)
            if found is not None and getattr(found, "__module__", None) == module.__name__:
                return found
    raise AttributeError(f"module {package!r} has no attribute {name!r}")

"""A config node `{_target_: module.callable, key: value, ...}` built by calling the callable with the other
keys (Hydra's `instantiate`); every failure one ConfigError line naming the key. No torch here: what a built
object must be is its builder's to say (engine/assembly/components.py)."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Mapping
from typing import Any

from hydra.utils import instantiate

from ..common.errors import ConfigError, first_line


def locate(path: str) -> Any:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as error:
            if error.name is None or not ".".join(parts[:cut]).startswith(error.name):
                raise  # the module exists but imports something missing: say that
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(f"No module named {parts[0]!r}")


def target_of(node: Mapping[str, Any], key: str) -> Callable[..., Any]:
    """The callable a `_target_` names, or one line saying why it cannot be had."""
    target = node.get("_target_") if isinstance(node, Mapping) else None
    if not isinstance(target, str) or not target:
        raise ConfigError(f"{key} has no _target_: give {key}._target_=<module>.<callable>")
    try:
        found = locate(target)
    except Exception as error:
        raise ConfigError(
            f"{key}._target_={target} does not import ({first_line(error)}): check the name and PYTHONPATH"
        ) from None
    if not callable(found):
        raise ConfigError(f"{key}._target_={target} is not callable: name a class or a function")
    return found


def import_targets(nodes: list[Any]) -> None:
    """Import the modules these nodes' `_target_`s come from, silently (the checking rank says what fails): a
    rank that does not check does it meanwhile, not once the group has formed (docs/speed.md)."""
    for node in nodes:
        target = node.get("_target_") if isinstance(node, Mapping) else None
        if isinstance(target, str) and target:
            with contextlib.suppress(Exception):
                locate(target)


def build(node: Mapping[str, Any], key: str, *args: Any) -> Any:
    """Call the node's `_target_` with `args` and its keys; errors become one line naming `key`."""
    target_of(node, key)
    try:
        return instantiate(dict(node), *args, _convert_="all")
    except ConfigError:
        raise
    except Exception as error:
        cause: BaseException = error
        while cause.__cause__ is not None:  # Hydra wraps the callable's own error
            cause = cause.__cause__
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(f"{key}._target_={node['_target_']} failed: {first_line(cause)}") from None


def is_map_style(item: Any) -> bool:
    return hasattr(item, "__getitem__") and hasattr(item, "__len__")


def describe(value: Any) -> str:
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"

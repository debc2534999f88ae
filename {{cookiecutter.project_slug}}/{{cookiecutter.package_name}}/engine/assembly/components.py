"""The open seam: the model, data sets, optimizer and task built from their config's `_target_`.

A config node `{_target_: module.callable, key: value, ...}` is built by calling the callable
with the keys as keyword arguments (Hydra's `instantiate`), so a user's own model, data set or
task is a yaml file and no change here. Every failure (a target that does not import, wrong
arguments, something of the wrong kind returned) becomes one ConfigError line naming the key.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn
from torch.utils.data import Dataset

from ...common.errors import ConfigError, first_line


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
    """Import the modules that these nodes' `_target_`s come from (torchvision, a user's model), and
    say nothing of those that fail: the checking rank says that. What a rank that does not check runs
    while the one that does works, so that no rank imports them only once the group has formed, with
    every other rank waiting for it at the first collective (docs/speed.md)."""
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


def build_model(config: Mapping[str, Any]) -> nn.Module:
    """A freshly initialised model (initialisation follows torch's global seed); `model.init_from`
    is the project's key, not the model's (init_weights.py reads it)."""
    model = build({key: value for key, value in config.items() if key != "init_from"}, "model")
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model._target_={config['_target_']} returned a {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def build_datasets(node: Mapping[str, Any]) -> tuple[Dataset, Dataset]:
    """The (train, val) pair of map-style data sets that `data.dataset._target_` returns."""
    pair = build(node, "data.dataset")
    if not (isinstance(pair, tuple | list) and len(pair) == 2 and all(is_map_style(item) for item in pair)):
        raise ConfigError(
            f"data.dataset._target_={node['_target_']} returned {describe(pair)}, not a pair "
            "(train, val) of map-style data sets (objects with __len__ and __getitem__)"
        )
    for name, dataset in zip(("train", "val"), pair, strict=True):
        if len(dataset) == 0:
            raise ConfigError(f"data.dataset._target_={node['_target_']}: the {name} set is empty")
    return pair[0], pair[1]


def is_map_style(item: Any) -> bool:
    return hasattr(item, "__getitem__") and hasattr(item, "__len__")


def describe(value: Any) -> str:
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


# No weight decay on biases and normalisation weights, as is customary.


def build_optimizer(config: Mapping[str, Any], model: nn.Module) -> torch.optim.Optimizer:
    """Any torch.optim class (or the user's own) from `optim._target_`, over the model's parameters."""
    options = dict(config)
    weight_decay = options.pop("weight_decay", 0.0)
    groups = [
        {"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": weight_decay},
        {"params": [p for p in model.parameters() if p.ndim <= 1], "weight_decay": 0.0},
    ]
    if isinstance(options.get("betas"), list):
        options["betas"] = tuple(options["betas"])
    optimizer = build(options, "optim", groups)
    if not isinstance(optimizer, torch.optim.Optimizer):
        kind = type(optimizer).__name__
        raise ConfigError(f"optim._target_={config['_target_']} returned a {kind}, not a torch.optim.Optimizer")
    return optimizer


def build_task(config: Mapping[str, Any]) -> Any:
    """The task: the loss of a batch and per-sample metrics (tasks.py has the built-in ones)."""
    task = build(offered_only(config), "task")
    missing = [name for name in ("loss", "metrics") if not callable(getattr(task, name, None))]
    if missing:
        raise ConfigError(
            f"task._target_={config['_target_']} has no {' or '.join(missing)} method: see tasks.py for the interface"
        )
    return task


# What the project's task configs offer the task beside its own arguments (task=language_model's token folder).
OFFERED = ("vocab_from",)


def offered_only(config: Mapping[str, Any]) -> dict[str, Any]:
    """The task's node without the offered keys its callable does not take: a task of your own under
    task=language_model is built as it was before the offer."""
    node = dict(config)
    offered = [key for key in OFFERED if key in node]
    if not offered:
        return node
    try:
        parameters = inspect.signature(target_of(node, "task")).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): as configured
        return node
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return node
    names = {parameter.name for parameter in parameters}
    return {key: value for key, value in node.items() if key not in offered or key in names}

"""The open seam: the model, optimizer and task built from their config's `_target_` (config/targets.py), each
checked to be of its kind, in one ConfigError line naming the key; the observe/ modules a run consults."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import torch
from torch import nn

from ...common.errors import ConfigError
from ...common.registry import modules_with

# The generic helpers and the data sets' builder live below the engine; they stay importable from here.
from ...config.targets import build, describe, import_targets, is_map_style, locate, target_of  # noqa: F401
from ..data.loader import build_datasets  # noqa: F401


def build_model(config: Mapping[str, Any]) -> nn.Module:
    """A freshly initialised model (from torch's global seed); `model.init_from` is the project's key."""
    model = build({key: value for key, value in config.items() if key != "init_from"}, "model")
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model._target_={config['_target_']} returned a {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def build_optimizer(config: Mapping[str, Any], model: nn.Module) -> torch.optim.Optimizer:
    """`optim._target_` over the model's parameters; no weight decay on biases and normalisation weights."""
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
    """The task: the loss of a batch and per-sample metrics (tasks/ has the built-in ones)."""
    task = build(offered_only(config), "task")
    missing = [name for name in ("loss", "metrics") if not callable(getattr(task, name, None))]
    if missing:
        raise ConfigError(
            f"task._target_={config['_target_']} has no {' or '.join(missing)} method: "
            "see tasks/__init__.py for the interface"
        )
    return task


def offered_keys() -> tuple[str, ...]:
    """The keys task configs offer beside the task's own arguments: each task module's `OFFERED`."""
    from ... import tasks

    found = modules_with(tasks.__name__, tasks.__path__, "OFFERED")
    return tuple(key for module in found for key in getattr(module, "OFFERED", ()))


def run_records() -> tuple[ModuleType, ...]:
    """The modules of observe/ that record each start of a run: a `RUN_RECORD` (a checkpoint owner's class:
    `start(run_dir, env)`, `params()`), `describe(payload)`, `write_export_record(checkpoint, payload, out, line)`."""
    return observe_modules("RUN_RECORD")


def observe_modules(name: str) -> tuple[ModuleType, ...]:
    """The modules of observe/ the project has that define `name`, in name order."""
    from ... import observe

    return tuple(module for module in modules_with(observe.__name__, observe.__path__, name) if hasattr(module, name))


def offered_only(config: Mapping[str, Any]) -> dict[str, Any]:
    """The task's node without the offered keys its callable does not take."""
    node = dict(config)
    offered = [key for key in offered_keys() if key in node]
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

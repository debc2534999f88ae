"""The open seam: the model, data sets, optimizer and task built from their config's `_target_`.

A config node `{_target_: module.callable, key: value, ...}` is built by calling the callable
with the keys as keyword arguments (Hydra's `instantiate`, through config/targets.py), so a user's
own model, data set or task is a yaml file and no change here. Every failure (a target that does not
import, wrong arguments, something of the wrong kind returned) becomes one ConfigError line naming the
key. The data sets' builder is the data path's (engine/data/loader.py's build_datasets).
"""

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
    """A freshly initialised model (initialisation follows torch's global seed); `model.init_from`
    is the project's key, not the model's (init_weights.py reads it)."""
    model = build({key: value for key, value in config.items() if key != "init_from"}, "model")
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model._target_={config['_target_']} returned a {type(model).__name__}, not a torch.nn.Module"
        )
    return model


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
    """What the project's task configs offer the task beside its own arguments (a prepared data set's
    folder): each task module's `OFFERED`, by what is present."""
    from ... import tasks

    found = modules_with(tasks.__name__, tasks.__path__, "OFFERED")
    return tuple(key for module in found for key in getattr(module, "OFFERED", ()))


def run_records() -> tuple[ModuleType, ...]:
    """What records each start of a run, where the project keeps such a record: each module of observe/ with a
    `RUN_RECORD` (a checkpoint owner's class: `start(run_dir, env)` on every rank, its `params()` for the
    trackers), a `describe(payload)` (eval's line on a checkpoint) and a `write_export_record(checkpoint,
    payload, out, line)` (its file beside an export), by what is present."""
    return observe_modules("RUN_RECORD")


def observe_modules(name: str) -> tuple[ModuleType, ...]:
    """The modules of observe/ that define `name` (a capability's: run_records; build_watch, the trainer's
    diagnostics around the loop, engine/trainer.py's Watch), those the project has, in name order."""
    from ... import observe

    return tuple(module for module in modules_with(observe.__name__, observe.__path__, name) if hasattr(module, name))


def offered_only(config: Mapping[str, Any]) -> dict[str, Any]:
    """The task's node without the offered keys its callable does not take: a task of your own under
    a project's task config is built as it was before the offer."""
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

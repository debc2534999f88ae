"""What a checkpoint from elsewhere may make this project build: an allowlist, and no write, delete or fetch.

Every `_target_` of a saved config must be one a config file of the project names, one the package registers
(the `BUILDABLE` tuples of REGISTRIES), a torch.nn module, a torch.optim optimizer or scheduler or a torchvision
model builder; a torchvision download, a data set path neither the command nor a config file names, a `download`
and a `${...}` are refused too, each in one line naming the opt-in (`trust_checkpoint=true`). The rule, and why:
docs/checkpoints.md ("A checkpoint from elsewhere"). A name outside the project is judged by its text alone.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator
from typing import Any

import yaml

from ...common.errors import ConfigError
from ...config import config_dir
from ...config.targets import locate

PACKAGE = __name__.split(".")[0]
REGISTRIES = ("models", "tasks", "datasets", "datasets.collate", "callbacks")  # each one's BUILDABLE tuple
NOT_BUILT = ("callbacks", "trust_checkpoint")  # what nothing that reads a checkpoint builds or obeys
DOWNLOADS = ("weights", "weights_backbone", "pretrained", "pretrained_backbone")  # a torchvision builder's
PATH_WORDS = ("root", "dir", "path", "folder", "file", "from", "url", "cache")


def saved_config(payload: Any) -> dict[str, Any]:
    """The config a run's checkpoint was saved with, or one line: without one nothing can be built or judged."""
    config = payload.get("config") if isinstance(payload, dict) else None
    if not isinstance(config, dict):
        what = "no config" if config is None else f"a config that is a {type(config).__name__}, not a mapping"
        raise ConfigError(f"the checkpoint holds {what}: not a run's checkpoint of this project; give a run's "
                          "checkpoints/step_<N>.pt or step_<N>/")  # fmt: skip
    return config


def check_trusted(saved: Any, trust: bool, opt_in: str, given: Collection[str] = ()) -> None:
    """Refuse, in one line naming it and `opt_in`, a saved config's `_target_` off the allowlist, interpolation
    or torchvision download; `given`: the dotted keys the user's command gave (the user's, not judged)."""
    if trust:
        return
    if not isinstance(saved, dict):
        saved_config({"config": saved})
    judged = {section: value for section, value in saved.items() if section not in NOT_BUILT}
    for key, _, text in leaves(judged):
        if isinstance(text, str) and "${" in text and not is_given(key, given):
            raise ConfigError(
                f"the checkpoint's config holds an interpolation, {key}={text[:80]}: a saved config is written "
                f"resolved, so this one was edited, and resolving it would read this machine's environment; load "
                f"it only if you trust where it came from, with {opt_in}"
            )
    for key, node, target in nodes(judged):
        if is_given(f"{key}._target_", given):
            continue
        if not trusted(target):
            raise ConfigError(
                f"the checkpoint's config names {key}._target_={target}, which no config of this project names "
                f"nor the package registers: building it would run code the project does not build; load it "
                f"only if you trust where it came from, with {opt_in}"
            )
        for name in DOWNLOADS if target.startswith("torchvision.") else ():
            if node.get(name) not in (None, False) and not is_given(f"{key}.{name}", given):
                raise ConfigError(
                    f"the checkpoint's config gives {key}.{name}={node[name]} to {key}._target_={target}: a "
                    f"download, which a checkpoint's settings never start (its own weights are loaded over them); "
                    f"give {key}.{name}=null, or {opt_in} if you trust where it came from"
                )


def check_data_paths(data: dict[str, Any], user_values: Collection[str], given: Collection[str], opt_in: str) -> None:
    """Refuse a path of the composed data node that neither the command (`user_values`: the values it gives) nor a
    config file of the project names, and a true `download` the command does not give."""
    target = data.get("dataset", {}).get("_target_") if isinstance(data.get("dataset"), dict) else None
    for key, name, value in leaves(data, "data"):
        if name == "download" and value and not (is_given(key, given) or f"data.{name}" in given):
            raise ConfigError(
                f"the checkpoint's config gives {key}={value} to data.dataset._target_={target}: a download, which "
                f"a checkpoint's settings never start; give data.download=true yourself, or {opt_in} if you trust "
                f"where it came from"
            )
        if is_path(name, value) and value not in user_values and value not in config_values():
            raise ConfigError(
                f"the checkpoint's config gives {key}={value[:120]} to data.dataset._target_={target}, a path that "
                f"neither this command nor a config of this project names: a checkpoint never chooses what a data "
                f"set reads, writes or fetches; give it on the command line ({key}={value[:60]}, or another path), "
                f"or {opt_in} if you trust where it came from"
            )


def command_values(overrides: list[str]) -> set[str]:
    """The strings a command's overrides give (`data.root=/x`: /x), as Hydra reads them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    found: set[str] = set()
    for item in OverridesParser.create().parse_overrides(overrides):
        found.update(value for _, _, value in leaves(item.value()) if isinstance(value, str))
    return found


def nodes(node: Any, key: str = "") -> Iterator[tuple[str, dict[str, Any], str]]:
    """(dotted key, node, its target's text) for every node with a `_target_` of a nested config, lists
    included, outer before inner (the order Hydra would import them)."""
    if isinstance(node, dict):
        if "_target_" in node:
            target = node["_target_"]
            yield key or "config", node, target if isinstance(target, str) else repr(target)
        for name, value in node.items():
            yield from nodes(value, f"{key}.{name}" if key else str(name))
    elif isinstance(node, list | tuple):
        for index, value in enumerate(node):
            yield from nodes(value, f"{key}[{index}]")


def leaves(node: Any, key: str = "", name: str = "") -> Iterator[tuple[str, str, Any]]:
    """(dotted key, the key's own name, value) for every value of a nested config; a list's items under their
    list's name."""
    if isinstance(node, dict):
        for child, value in node.items():
            yield from leaves(value, f"{key}.{child}" if key else str(child), str(child))
    elif isinstance(node, list | tuple):
        for index, value in enumerate(node):
            yield from leaves(value, f"{key}[{index}]", name)
    else:
        yield key, name, node


def is_given(key: str, given: Collection[str]) -> bool:
    """Whether the command gave this key, or a group or node above it (`model=resnet18`, `data.dataset=`)."""
    return any(key == name or key.startswith((f"{name}.", f"{name}[")) for name in given)


def is_path(name: str, value: Any) -> bool:
    """A non-empty string whose key names a path (PATH_WORDS), or that holds a `/` or `\\` or starts with `~` or `.`."""
    if not isinstance(value, str) or not value or name == "_target_":
        return False
    named = any(word in name.lower() for word in PATH_WORDS)
    return named or any(mark in value for mark in "/\\") or value.startswith(("~", "."))


def trusted(target: str) -> bool:
    """Whether `target` is on the allowlist."""
    if target in config_targets():
        return True
    if target.startswith(f"{PACKAGE}."):
        found = located(target)
        return found is not None and any(found is allowed for allowed in package_allowlist())
    if target.startswith(("torch.nn.", "torch.optim.", "torchvision.models.")):
        return from_torch(target)
    return False


@functools.cache
def config_targets() -> frozenset[str]:
    """Every `_target_` this project's config files name (what a user could have trained with)."""
    return frozenset(target for document in config_documents() for _, _, target in nodes(document))


@functools.cache
def config_values() -> frozenset[str]:
    """Every string value of this project's config files (a path they name: data/cifar10)."""
    return frozenset(value for document in config_documents() for _, _, value in leaves(document)
                     if isinstance(value, str))  # fmt: skip


def config_documents() -> list[Any]:
    found = []
    for path in sorted(config_dir().rglob("*.yaml")):
        try:
            found.append(yaml.safe_load(path.read_text()))
        except (OSError, yaml.YAMLError):
            continue  # not ours to judge here: Hydra says so when it composes
    return found


@functools.cache
def package_allowlist() -> tuple[Any, ...]:
    """What of this package a checkpoint may build: each registry's BUILDABLE and what the config files name
    (compared by identity: a name kept from before a module moved is what it names)."""
    import importlib

    registered = [item for name in REGISTRIES
                  for item in getattr(importlib.import_module(f"{PACKAGE}.{name}"), "BUILDABLE", ())]  # fmt: skip
    named = [located(target) for target in config_targets() if target.startswith(f"{PACKAGE}.")]
    return tuple(item for item in (*registered, *named) if item is not None)


def from_torch(target: str) -> bool:
    """Whether `target` is a torch.nn module class, torch.optim optimizer or scheduler, or torchvision model builder."""
    import torch
    from torch import nn

    found = located(target)
    if isinstance(found, type):
        if target.startswith("torch.optim."):
            schedulers = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
            return issubclass(found, (torch.optim.Optimizer, *schedulers))
        return issubclass(found, nn.Module)
    if target.startswith("torchvision.models.") and callable(found):
        import torchvision

        builders = (torchvision.models.get_model_builder(name) for name in torchvision.models.list_models())
        return any(found is builder for builder in builders)
    return False


def located(target: str) -> Any:
    """What a dotted name of an installed package is, or None."""
    try:
        return locate(target)
    except Exception:
        return None

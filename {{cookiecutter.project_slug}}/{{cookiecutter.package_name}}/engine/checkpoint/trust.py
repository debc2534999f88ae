"""What a checkpoint from elsewhere may make this project run: nothing but what its own configs could name.

A checkpoint holds the config it was trained with, and eval.py, the export, predict and generate build
its model (and data set, task) from the `_target_`s in it. A doctored copy could name any callable, and
building it would run that code, imported from wherever Python finds it (a folder shipped beside the
checkpoint). So before anything is built, every `_target_` of a saved config must be one of:
- a `_target_` that one of this project's config files names (configs/**/*.yaml, the user's own files too);
- a class or function of this package's own modules on the user's side (models, tasks, data sets,
  augmentation; not the machinery below, which writes files and starts processes);
- a torch.nn module class, a torch.optim optimizer or scheduler class, a torchvision model builder.
Anything else is refused in one line naming it and the opt-in, `trust_checkpoint=true` (Hugging Face's
`trust_remote_code`): only for a checkpoint whose source you trust as you trust code you run.
A name outside the project is refused by its text alone: nothing of it is imported to decide.

A saved config is written resolved (config/compose.py's to_plain_dict), so a `${...}` in one was put
there by hand: resolving it would read this machine's environment (`${oc.env:AWS_SECRET_ACCESS_KEY}`) into
what is built or logged. It is refused by the same rule, and resolved only with the opt-in.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import yaml

from ...common.errors import ConfigError
from ...config import config_dir

PACKAGE = __name__.split(".")[0]
# The package's machinery: its modules write files, start processes or train; a saved config names none
# of them unless this project's own config files do (its schedules do).
# (The shared modules' names from before they moved into common/ are refused too: they are no modules now.)
MACHINERY = ("engine", "launch", "observe", "config", "common", "train", "eval", "export", "predict", "generate",
             "comm_check", "datasets.prepare", "datasets.tokenizer", "run_dir", "errors", "redaction", "processes",
             "capacity", "placement", "storage")  # fmt: skip


def check_trusted(saved: Any, trust: bool, opt_in: str) -> None:
    """Refuse, in one line naming it and `opt_in`, a saved config that names a `_target_` this project
    could not name itself; nothing is imported of a name outside the project."""
    if trust:
        return
    for key, text in interpolations(saved):
        raise ConfigError(
            f"the checkpoint's config holds an interpolation, {key}={text[:80]}: a saved config is written "
            f"resolved, so this one was edited, and resolving it would read this machine's environment; load it "
            f"only if you trust where it came from, with {opt_in}"
        )
    for key, target in targets(saved):
        if not trusted(target):
            raise ConfigError(
                f"the checkpoint's config names {key}._target_={target}, which no config of this project names: "
                f"building it would run code from outside the project; load it only if you trust where it came "
                f"from, with {opt_in}"
            )


def targets(node: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, target) for every `_target_` in a nested config, lists included (Hydra builds them all)."""
    if isinstance(node, dict):
        for name, value in node.items():
            if name == "_target_":
                yield key or "config", value if isinstance(value, str) else repr(value)
            else:
                yield from targets(value, f"{key}.{name}" if key else str(name))
    elif isinstance(node, list | tuple):
        for index, value in enumerate(node):
            yield from targets(value, f"{key}[{index}]")


def interpolations(node: Any, key: str = "config") -> Iterator[tuple[str, str]]:
    """(dotted key, text) for every string of a nested config that OmegaConf would resolve."""
    if isinstance(node, dict):
        for name, value in node.items():
            yield from interpolations(value, f"{key}.{name}" if key != "config" else str(name))
    elif isinstance(node, list | tuple):
        for index, value in enumerate(node):
            yield from interpolations(value, f"{key}[{index}]")
    elif isinstance(node, str) and "${" in node:
        yield key, node


def trusted(target: str) -> bool:
    if target in config_targets():
        return True
    if target.startswith(f"{PACKAGE}."):
        return own(target)
    if target.startswith(("torch.nn.", "torch.optim.", "torchvision.models.")):
        return from_torch(target)
    return False


@functools.cache
def config_targets() -> frozenset[str]:
    """Every `_target_` this project's config files name (what a user could have trained with)."""
    found: set[str] = set()
    for path in config_dir().rglob("*.yaml"):
        try:
            found.update(target for _, target in targets(yaml.safe_load(path.read_text())))
        except (OSError, yaml.YAMLError):
            continue  # not ours to judge here: Hydra says so when it composes
    return frozenset(found)


def own(target: str) -> bool:
    """A name of this package: allowed where it is what a config file names (a module moved since keeps
    its old name), or where it is defined on the user's side."""
    found = located(target)
    if found is None:
        return False
    if any(found is located(name) for name in config_targets() if name.startswith(f"{PACKAGE}.")):
        return True
    module = getattr(found, "__module__", "") or ""
    inside = module.removeprefix(f"{PACKAGE}.")
    return module.startswith(f"{PACKAGE}.") and not any(
        inside == part or inside.startswith(f"{part}.") for part in MACHINERY
    )


def from_torch(target: str) -> bool:
    """A torch.nn module class, a torch.optim optimizer or scheduler, a torchvision model builder."""
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
    """What a dotted name of an installed package (torch, torchvision, this one) is, or None."""
    from ..assembly.components import locate

    try:
        return locate(target)
    except Exception:
        return None

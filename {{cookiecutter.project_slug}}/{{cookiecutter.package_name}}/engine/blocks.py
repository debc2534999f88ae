"""A model's repeated blocks: the units activation checkpointing recomputes and a sharding strategy shards one
by one, so that one setting means the same under every strategy."""

from __future__ import annotations

from typing import cast

from torch import nn

from ..common.errors import ConfigError


def find_blocks(model: nn.Module, class_names: list[str], key: str = "blocks") -> list[nn.Module]:
    """The modules of the classes `key` names, else the model's repeated units (ModuleLists' items, layer1..4)."""
    if class_names:
        present = {type(module).__name__ for module in model.modules()}
        if not present & set(class_names):  # a typo would gather the whole model at once, said only in passing
            raise ConfigError(  # (one list may name the blocks of several models: [BasicBlock,Bottleneck])
                f"{key}={list(class_names)} names no class {type(model).__name__} has: name its repeated "
                f"blocks' classes (it has {', '.join(sorted(present)[:12])}), or [] for the automatic ones"
            )
        return [module for module in model.modules() if type(module).__name__ in class_names]
    stages = [getattr(model, name, None) for name in ("layer1", "layer2", "layer3", "layer4")]
    if all(isinstance(stage, nn.Module) for stage in stages):
        return cast(list[nn.Module], stages)
    return [item for module in model.modules() if isinstance(module, nn.ModuleList) for item in module]

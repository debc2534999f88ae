"""Which strategies the project has and the config sections each reads (ddp's, and config/sharding.py's where
the project has it). A section the chosen strategy does not read, set otherwise than train.yaml, is refused."""

from __future__ import annotations

from dataclasses import field
from pathlib import Path
from typing import Any, TypeVar

from ..common.registry import modules_with
from .values import LOSS_SCALING, require, train_defaults

STRATEGY_MODULES = modules_with(__package__, [str(Path(__file__).parent)], "SECTION_TYPES")
SECTION_TYPES: dict[str, type] = {}
STRATEGY_SECTIONS: dict[str, tuple[str, ...]] = {"ddp": ("ddp",)}  # each strategy and the sections it reads
BLOCKS = ""  # the key naming the classes trainer.activation_checkpointing recomputes ("": found, engine/blocks.py)
for _module in (module for module in STRATEGY_MODULES if hasattr(module, "STRATEGIES")):  # not this one
    SECTION_TYPES.update(_module.SECTION_TYPES)
    STRATEGY_SECTIONS.update(_module.STRATEGIES)
    BLOCKS = _module.BLOCKS or BLOCKS
Config = TypeVar("Config")


def with_strategy_sections(cls: type[Config]) -> type[Config]:
    """A dataclass-to-be with a field for each section of SECTION_TYPES (each its own default)."""
    for name, kind in SECTION_TYPES.items():
        cls.__annotations__[name] = kind  # a type, not a string: OmegaConf resolves it as it is
        setattr(cls, name, field(default_factory=kind))
    return cls


def check_strategy_options(config: Any) -> None:
    """What the chosen strategy cannot do: fp16 without loss scaling, another strategy's options."""
    require(
        config.trainer.precision != "fp16" or config.strategy in LOSS_SCALING,
        f"trainer.precision=fp16 needs loss scaling, which strategy={config.strategy} does not do: use "
        "trainer.precision=bf16 (fp32's range, no scaling needed)",
    )
    read = STRATEGY_SECTIONS[config.strategy]
    defaults = train_defaults()
    for strategy, sections in STRATEGY_SECTIONS.items():
        for section in (section for section in sections if section not in read):
            for key, value in vars(getattr(config, section)).items():
                if f"{section}.{key}" == BLOCKS and config.trainer.activation_checkpointing:
                    continue  # the blocks activation checkpointing recomputes, under every strategy
                require(
                    defaults[section].get(key) == value,
                    f"{section}.{key}={value} is a {section.upper()} option, and strategy={config.strategy} does not "
                    f"use it: drop it, or use strategy={strategy}",
                )

"""The configuration: its typed schema (schema.py, commands.py; defaults and meanings live in configs/), the
rules a value is checked by (values.py), Hydra's config to checked dataclasses and back (compose.py).
Imported by launcher and workers alike: no torch here."""

from __future__ import annotations

from typing import Any

from .commands import PredictConfig
from .compose import (
    CONFIG_GROUPS,
    compose_for_checkpoint,
    let_group_keys_through,
    register_configs,
    to_plain_dict,
    to_train_config,
)
from .schema import (
    STRATEGY_SECTIONS,
    CheckpointConfig,
    DataConfig,
    DDPConfig,
    DistConfig,
    EvalConfig,
    LogConfig,
    TrainConfig,
    TrainerConfig,
)
from .strategies import STRATEGY_MODULES
from .values import COMM_HOOKS, PRECISIONS, config_dir, require_choice

__all__ = [
    "COMM_HOOKS",
    "CONFIG_GROUPS",
    "PRECISIONS",
    "STRATEGY_SECTIONS",
    "CheckpointConfig",
    "DDPConfig",
    "DataConfig",
    "DistConfig",
    "EvalConfig",
    "LogConfig",
    "PredictConfig",
    "TrainConfig",
    "TrainerConfig",
    "compose_for_checkpoint",
    "config_dir",
    "let_group_keys_through",
    "register_configs",
    "require_choice",
    "to_plain_dict",
    "to_train_config",
]


def __getattr__(name: str) -> Any:
    """A name of an optional module's `__all__` (config/sharding.py's), as `config.<Name>` imported it before."""
    for module in STRATEGY_MODULES:
        if name in getattr(module, "__all__", ()):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The configuration, in one place: its typed schema (schema.py: types and rules; commands.py: the keys
of the commands that read a checkpoint; each key's default and its one-line meaning live in
configs/train.yaml and the group files, nowhere else), the rules a value is checked by (values.py), and
the way from Hydra's composed config to checked dataclasses and back to plain values (compose.py).
Imported by launcher and workers alike: no torch here."""

from __future__ import annotations

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
    CheckpointConfig,
    DataConfig,
    DDPConfig,
    DistConfig,
    EvalConfig,
    FSDPConfig,
    HSDPConfig,
    LogConfig,
    TrainConfig,
    TrainerConfig,
)
from .values import COMM_HOOKS, PRECISIONS, STRATEGY_SECTIONS, config_dir, require_choice, step_range

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
    "FSDPConfig",
    "HSDPConfig",
    "LogConfig",
    "PredictConfig",
    "TrainConfig",
    "TrainerConfig",
    "compose_for_checkpoint",
    "config_dir",
    "let_group_keys_through",
    "register_configs",
    "require_choice",
    "step_range",
    "to_plain_dict",
    "to_train_config",
]

"""The rules a config value is checked by (one line per mistake, saying what to give), the choices
the schema offers, and where the yaml files are."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ..common.errors import ConfigError


def config_dir() -> Path:
    """configs/: inside the package once installed, beside it in a source checkout."""
    package = Path(__file__).resolve().parent.parent
    inside = package / "configs"
    return inside if inside.is_dir() else package.parent / "configs"


@functools.cache
def train_defaults() -> dict[str, Any]:
    """configs/train.yaml's own values (its sections' defaults), read once per process."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(config_dir() / "train.yaml"))  # type: ignore[return-value]


def require(condition: bool, message: str) -> None:
    """Raise ConfigError(message) unless condition holds."""
    if not condition:
        raise ConfigError(message)


def require_positive(key: str, value: float) -> None:
    require(value > 0, f"{key} must be > 0, got {value}: set {key}=<positive number>")


def require_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    require(value in choices, f"{key}={value!r} is not one of {', '.join(choices)}")


BACKENDS = ("auto", "nccl", "gloo", "mpi")
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
PRECISIONS = ("fp32", "bf16", "fp16")
MONITOR_MODES = ("min", "max")
LOSS_SCALING = ("ddp",)  # fp16 needs a loss scale; the others use bf16 (fp32's range) instead


def whole_number(key: str, value: Any, least: int) -> int:
    require(
        isinstance(value, int) and not isinstance(value, bool) and value >= least,
        f"{key} must be a whole number >= {least}, got {value!r}",
    )
    return value


def number(key: str, value: Any, least: float, strictly: bool = False) -> float:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    require(
        is_number and (value > least if strictly else value >= least),
        f"{key} must be a number {'>' if strictly else '>='} {least}, got {value!r}",
    )
    return float(value)


def flag(key: str, value: Any) -> bool:
    require(isinstance(value, bool), f"{key} must be true or false, got {value!r}")
    return value


def require_target(key: str, node: Any) -> None:
    require(
        isinstance(node, dict) and isinstance(node.get("_target_"), str),
        f"{key} needs a _target_ (a callable, module.name): see configs/{key.split('.')[0]}/",
    )

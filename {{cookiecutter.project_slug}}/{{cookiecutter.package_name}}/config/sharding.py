"""The config sections of strategy=fsdp and hsdp (engine/strategies/fsdp.py, hsdp.py): `fsdp:` and
`hsdp:` in configs/train.yaml. TrainConfig takes them from SECTION_TYPES (strategies.py), so a project
made without these strategies has neither the sections nor any rule about them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from omegaconf import MISSING

from .values import require


@dataclass
class FSDPConfig:
    blocks: list[str] = MISSING
    reshard_after_forward: bool = MISSING
    cpu_offload: bool = MISSING


@dataclass
class HSDPConfig:
    shard_size: int = MISSING

    def check(self) -> None:
        require(self.shard_size >= 0, f"hsdp.shard_size must be >= 0 (0: each node's processes), got {self.shard_size}")


__all__ = ["FSDPConfig", "HSDPConfig"]  # <package>.config.<Name> too, as before this module (config/__init__.py)
SECTION_TYPES = {"fsdp": FSDPConfig, "hsdp": HSDPConfig}  # TrainConfig's sections beside ddp's
STRATEGIES = {"fsdp": ("fsdp",), "hsdp": ("fsdp", "hsdp")}  # the sections each strategy reads
BLOCKS = "fsdp.blocks"  # the classes trainer.activation_checkpointing recomputes, under every strategy


def fsdp_of(config: Any) -> FSDPConfig:
    """A TrainConfig's fsdp section, typed (TrainConfig's fields are typed without it)."""
    return cast(FSDPConfig, config.fsdp)


def hsdp_of(config: Any) -> HSDPConfig:
    """A TrainConfig's hsdp section, typed."""
    return cast(HSDPConfig, config.hsdp)

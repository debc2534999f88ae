"""How the model is spread over the ranks: one module per strategy (`strategy=<name>`: ddp.py, and those that shard
the model where the project has them), one small interface. Everything the engine does differently by strategy is
a method here: outside this package nothing asks which strategy runs.
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ...common.placement import DistEnv
from ...config import CheckpointConfig, TrainConfig
from ..distributed.process_group import sync_buffers_from_rank_zero


class Strategy:
    """The interface, with what most strategies share: `prepare` the model on its device (before the optimizer
    exists), `wrap` it with its optimizer (what trains), then train."""

    name: ClassVar[str]
    needs_group_of_one: ClassVar[bool] = False  # a process group even for one process (a device mesh needs it)
    lockstep_evaluation: ClassVar[bool] = False  # every rank runs as many evaluation forwards (sharded params)
    autocasts: ClassVar[bool] = True  # trainer.precision by autocast; False where a policy casts instead

    def __init__(self, config: TrainConfig, env: DistEnv) -> None:
        self.config, self.env = config, env
        self.model: nn.Module | None = None  # the user's model as the strategy holds it (sharded in place, say)
        self.optimizer: torch.optim.Optimizer | None = None

    def check(self, use_cuda: bool) -> None:
        """Refuse, in one line (ConfigError), what this strategy cannot do on this machine."""

    def prepare(self, model: nn.Module) -> nn.Module:
        """The model as the optimizer must see it (on its device already)."""
        self.model = model
        return model

    def wrap(self, trainable: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        """What runs the forward and backward: `trainable` is the prepared model, compiled or not."""
        self.optimizer = optimizer
        return trainable

    def gradient_sync(self, trained: nn.Module, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        """A context whose backward reduces gradients over the ranks only if `enabled`."""
        return contextlib.nullcontext()

    def after_step(self) -> None:
        """After each optimizer step."""

    def sync_buffers(self) -> None:
        """Rank 0's buffers on every rank: the rule every strategy keeps, before evaluation too."""
        assert self.model is not None
        sync_buffers_from_rank_zero(self.model)

    def state_dict(self) -> dict[str, Any]:
        """The model's and the optimizer's part of a checkpoint (a collective: all ranks call it)."""
        raise NotImplementedError

    def load_state_dict(self, payload: dict[str, Any], source: Path) -> None:
        """The inverse of any strategy's state_dict(): a whole `.pt`'s payload, or a folder of shards' (`source`)."""
        raise NotImplementedError

    def checkpointer(self, folder: Path, config: CheckpointConfig, is_writer: bool) -> Any:
        """What writes this strategy's checkpoints (engine/checkpoint/)."""
        raise NotImplementedError

    def all_finite(self) -> bool:
        """Whether the weights are finite, the same answer on every rank."""
        raise NotImplementedError

    def full_weights(self) -> dict[str, torch.Tensor]:
        """The whole model state dict (a fingerprint, an export): on rank 0 alone ({} elsewhere) where gathered."""
        raise NotImplementedError


def names() -> list[str]:
    """The strategies this project has: the modules beside this file."""
    return sorted(path.stem for path in Path(__file__).parent.glob("[a-z]*.py"))


def strategy_class(name: str) -> type[Strategy]:
    """The strategy of that name: its module's STRATEGY class."""
    return importlib.import_module(f".{name}", __name__).STRATEGY


def build_strategy(config: TrainConfig, env: DistEnv) -> Strategy:
    """The strategy `config.strategy` names, for this rank."""
    return strategy_class(config.strategy)(config, env)

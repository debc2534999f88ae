"""Tensors that may be sharded (a sharding strategy's DTensors, ddp's plain tensors), asked about without importing
torch.distributed.tensor (a second of the start of eval.py, predict.py and a one-process run)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TypeGuard

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


def is_sharded(tensor: object) -> TypeGuard[DTensor]:
    """Whether `tensor` is a DTensor (none can be where torch.distributed.tensor was never imported)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(tensor, dtensor.DTensor)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: the local shard of a DTensor, the tensor itself otherwise."""
    return tensor.to_local() if is_sharded(tensor) else tensor

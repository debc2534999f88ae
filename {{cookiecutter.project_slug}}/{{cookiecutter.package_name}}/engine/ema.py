"""trainer.ema: an exponential moving average of the weights, which validation, eval.py and the export use
(docs/recipe.md). It has the parameters' own layout (a sharding strategy's DTensors too) and is checkpointed as
`ema`, by parameter name; buffers are not averaged.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import nn

from .distributed.dtensors import local

log = logging.getLogger(__name__)


class EMA:
    def __init__(self, model: nn.Module, decay: float, start_step: int) -> None:
        self.decay, self.start_step = decay, start_step
        named = [(name, p) for name, p in model.named_parameters()]
        self.names, self.params = [name for name, _ in named], [p for _, p in named]
        self.average = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def update(self, step: int) -> None:
        """After optimizer step `step` (numbered from 1)."""
        averages, weights = [local(a) for a in self.average], [local(p.detach()) for p in self.params]
        if step <= self.start_step:
            torch._foreach_copy_(averages, weights)
        else:
            torch._foreach_lerp_(averages, weights, 1.0 - self.decay)

    @contextlib.contextmanager
    @torch.no_grad()
    def swapped_in(self) -> Iterator[None]:
        """The model holds the average within (for a validation), its own weights again after."""
        weights = [local(p.detach()) for p in self.params]
        kept = [w.clone() for w in weights]
        torch._foreach_copy_(weights, [local(a) for a in self.average])
        try:
            yield
        finally:
            torch._foreach_copy_(weights, kept)

    def state_dict(self) -> dict[str, Any]:
        return {"ema": dict(zip(self.names, self.average, strict=True))}

    @torch.no_grad()
    def load_state_dict(self, payload: dict[str, Any]) -> None:
        saved = payload.get("ema") or {}
        if not saved:  # a checkpoint of a run without it: the average starts from the weights resumed
            log.info("the checkpoint holds no EMA of the weights: the average starts from its weights")
            torch._foreach_copy_([local(a) for a in self.average], [local(p.detach()) for p in self.params])
            return
        for name, average in zip(self.names, self.average, strict=True):
            value = saved[name]
            if value is average:  # read in place from a folder of shards
                continue
            local(average).copy_(local(shard_like(value, average)))


def shard_like(whole: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """A whole tensor (a ddp checkpoint's) laid out as `live` is (a DTensor: sharded locally, no communication)."""
    mesh = getattr(live, "device_mesh", None)
    if mesh is None or getattr(whole, "device_mesh", None) is not None:
        return whole
    from torch.distributed.tensor import DTensor, distribute_tensor

    placements = cast(DTensor, live).placements  # a DTensor: it has a mesh
    return distribute_tensor(whole.to(local(live).device), mesh, placements, src_data_rank=None)


class NoEMA:
    """trainer.ema.decay=0: nothing averaged, nothing in the checkpoint."""

    def update(self, step: int) -> None:
        pass

    def swapped_in(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        pass

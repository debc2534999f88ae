"""strategy=ddp: a whole model on every rank, gradients all-reduced by DistributedDataParallel with every ddp.* knob
(`ddp.comm_hook`: ../distributed/comm_hooks.py); rank 0 writes one `step_<N>.pt` per checkpoint.
"""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ...common.errors import ConfigError
from ...common.placement import DistEnv
from ...config import CheckpointConfig, DDPConfig
from ..checkpoint.files import restore, shards_reader
from ..checkpoint.writer import Checkpointer
from ..distributed.comm_hooks import hook_state_dict, load_hook_state, register_comm_hook
from ..distributed.process_group import is_distributed
from . import Strategy


def wrap_ddp(model: nn.Module, config: DDPConfig, env: DistEnv) -> nn.Module:
    """DDP around the model with the ddp.* knobs; the bare model for a world of one."""
    if not is_distributed():
        return model
    # Newer torch renames broadcast_buffers (same meaning here: sync buffers at every forward).
    renamed = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    sync: dict[str, Any] = {"forward_sync_buffers" if renamed else "broadcast_buffers": config.broadcast_buffers}
    return DistributedDataParallel(
        model,
        device_ids=[env.device.index] if env.device.type == "cuda" else None,
        bucket_cap_mb=config.bucket_cap_mb,
        gradient_as_bucket_view=config.gradient_as_bucket_view,
        static_graph=config.static_graph,
        find_unused_parameters=config.find_unused_parameters,
        **sync,
    )


class DDP(Strategy):
    name = "ddp"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.comm_hook: Any = None  # PowerSGD's, whose memory a checkpoint keeps; None for the others

    def check(self, use_cuda: bool) -> None:
        if self.config.ddp.sync_batchnorm and self.env.world_size > 1 and not use_cuda:
            raise ConfigError(
                f"ddp.sync_batchnorm=true needs GPUs (SyncBatchNorm does not run on CPUs), and this job runs "
                f"{self.env.world_size} processes on CPUs: drop it, or run on GPUs"
            )

    def prepare(self, model: nn.Module) -> nn.Module:
        if self.config.ddp.sync_batchnorm and self.env.world_size > 1:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        return super().prepare(model)

    def wrap(self, trainable: nn.Module, optimizer: torch.optim.Optimizer) -> nn.Module:
        super().wrap(trainable, optimizer)
        trained = wrap_ddp(trainable, self.config.ddp, self.env)
        self.comm_hook = register_comm_hook(trained, self.config.ddp, self.env)
        return trained

    def gradient_sync(self, trained: nn.Module, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        no_sync = getattr(trained, "no_sync", None)  # a world of one has no DDP wrapper
        return no_sync() if no_sync is not None and not enabled else contextlib.nullcontext()

    def state_dict(self) -> dict[str, Any]:
        assert self.model is not None and self.optimizer is not None
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "comm_hook": hook_state_dict(self.comm_hook),  # PowerSGD's memory, gathered on rank 0
        }

    def load_state_dict(self, payload: dict[str, Any], source: Path) -> None:
        assert self.model is not None and self.optimizer is not None
        if "model" not in payload:  # a folder of shards: each rank reads the tensors whole
            shards_reader(source).load_sharded(source, self.model, self.optimizer)
        else:
            restore(self.model, payload, source)
            self.optimizer.load_state_dict(payload["optimizer"])
        load_hook_state(self.comm_hook, payload.get("comm_hook"))

    def checkpointer(self, folder: Path, config: CheckpointConfig, is_writer: bool) -> Checkpointer:
        return Checkpointer(folder, config, is_writer)

    def all_finite(self) -> bool:
        # DDP keeps the weights equal on every rank: each one's own answer is every rank's.
        assert self.model is not None
        checks = [torch.isfinite(t).all() for t in self.model.state_dict().values() if t.is_floating_point()]
        return bool(torch.stack(checks).all()) if checks else True  # one read back to the host

    def full_weights(self) -> dict[str, torch.Tensor]:
        assert self.model is not None
        return self.model.state_dict()


STRATEGY = DDP

"""strategy=fsdp: parameters, gradients and optimizer state sharded over the ranks (FSDP2).

`fully_shard` is applied to each block (the unit whose parameters are gathered for its forward
and freed after it), then to the root. The blocks are the module classes `fsdp.blocks` names,
or else the model's own repeated units: a transformer's blocks, a ResNet's stages. Parameters
become DTensors sharded on dim 0; the optimizer, built afterwards, steps on the local shards.
Mixed precision follows trainer.precision: bf16 gathers parameters in bf16 and reduces
gradients in fp32 (no autocast: the policy casts).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from ...common.errors import ConfigError
from ...config import CheckpointConfig
from ...config.sharding import BLOCKS, FSDPConfig, fsdp_of
from ..blocks import find_blocks
from ..distributed.dtensors import local
from ..distributed.process_group import all_reduce_sum
from . import Strategy

log = logging.getLogger(__name__)


def class_name(block: nn.Module) -> str:
    """A block's class as fsdp.blocks names it (fully_shard makes its class FSDP<class>)."""
    from torch.distributed.fsdp import FSDPModule

    return next(cls for cls in type(block).__mro__ if not issubclass(cls, FSDPModule)).__name__


def shard_model(model: nn.Module, config: FSDPConfig, precision: str, mesh: Any) -> list[nn.Module]:
    """fully_shard the blocks, then the root, over `mesh`, in place; the blocks. A 1-D mesh shards over
    all its ranks; a 2-D one (replicate, shard) shards along its second dimension and replicates along
    its first (HSDP)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    options: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": config.reshard_after_forward,
        "offload_policy": CPUOffloadPolicy() if config.cpu_offload else OffloadPolicy(),
    }
    bf16 = precision == "bf16"
    if bf16:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    blocks = find_blocks(model, config.blocks, BLOCKS)
    for block in blocks:
        fully_shard(block, **options)
    if bf16:  # the loss in fp32, as autocast would compute it
        options["mp_policy"] = MixedPrecisionPolicy(torch.bfloat16, torch.float32, output_dtype=torch.float32)
    fully_shard(model, **options)
    return blocks


class FSDP(Strategy):
    name = "fsdp"
    needs_group_of_one = True  # the device mesh needs a process group
    lockstep_evaluation = True  # every forward gathers the parameters: every rank runs as many
    autocasts = False  # trainer.precision=bf16 is the mixed-precision policy

    def check(self, use_cuda: bool) -> None:
        if fsdp_of(self.config).cpu_offload and not use_cuda:
            raise ConfigError(
                "fsdp.cpu_offload=true moves the shards off the GPUs, and this job runs on CPUs, where they are "
                "already: drop it (or run on GPUs)"
            )

    def mesh(self, device: torch.device) -> Any:
        """A 1-D mesh of all ranks: every one holds 1/N of each sharded tensor."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device.type, (self.env.world_size,))

    def describe_mesh(self) -> str:
        return f"over {self.env.world_size} ranks"

    def prepare(self, model: nn.Module) -> nn.Module:
        device = next(model.parameters()).device
        blocks = shard_model(model, fsdp_of(self.config), self.config.trainer.precision, self.mesh(device))
        kinds = ", ".join(sorted({class_name(block) for block in blocks})) or "none"
        log.info("%s: %d blocks sharded (%s) %s, then the root", self.name, len(blocks), kinds, self.describe_mesh())
        return super().prepare(model)

    def gradient_sync(self, trained: nn.Module, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        assert self.model is not None  # one reduce-scatter, on the step's last micro-batch
        self.model.set_requires_gradient_sync(enabled)  # type: ignore[operator]
        return contextlib.nullcontext()

    def after_step(self) -> None:
        # DDP's broadcast_buffers starts each step from rank 0's buffers; fsdp has nothing that does, so the
        # ranks' BatchNorm statistics would drift apart and a checkpoint would keep any rank's copy.
        self.sync_buffers()

    def state_dict(self) -> dict[str, Any]:
        assert self.model is not None and self.optimizer is not None
        from ..checkpoint.sharded import sharded_state  # torch.distributed.checkpoint: 1.7 s to import

        return sharded_state(self.model, self.optimizer)  # this rank's shards, by parameter name

    def load_state_dict(self, payload: dict[str, Any], source: Path) -> None:
        assert self.model is not None and self.optimizer is not None
        from ..checkpoint.sharded import load_full_state, load_sharded  # torch.distributed.checkpoint: 1.7 s

        if "model" in payload:  # a ddp checkpoint continues sharded
            load_full_state(self.model, self.optimizer, payload["model"], payload["optimizer"])
        else:
            load_sharded(source, self.model, self.optimizer)  # resharded to this world size and mesh

    def checkpointer(self, folder: Path, config: CheckpointConfig, is_writer: bool) -> Any:
        from ..checkpoint.sharded import ShardedCheckpointer

        return ShardedCheckpointer(folder, config, is_writer)

    def all_finite(self) -> bool:
        assert self.model is not None  # each rank checks its shards; the sum says it for all
        return int(all_reduce_sum(1 - finite(self.model)).item()) == 0

    def full_weights(self) -> dict[str, torch.Tensor]:
        """Gathered on rank 0 alone, in CPU memory (the others get {}): ddp's names and tensors."""
        assert self.model is not None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # a full state dict: tensors alone
        return cast(dict[str, torch.Tensor], get_model_state_dict(self.model, options=options))


def finite(model: nn.Module) -> torch.Tensor:
    """1 where every floating-point tensor of this rank's part of the model is finite, else 0 (on
    the device, not read back: under fsdp the ranks' answers are summed before anyone decides)."""
    checks = [torch.isfinite(local(t)).all() for t in model.state_dict().values() if t.is_floating_point()]
    device = next(model.parameters()).device
    return torch.stack(checks).all().to(torch.int64) if checks else torch.ones((), dtype=torch.int64, device=device)


def per_rank_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """The bytes this rank holds for parameters, gradients and optimizer state."""

    def size(tensors: Any) -> int:
        return sum(local(t).numel() * local(t).element_size() for t in tensors if isinstance(t, torch.Tensor))

    return {
        "parameters": size(model.parameters()),
        "gradients": size(p.grad for p in model.parameters() if p.grad is not None),
        "optimizer": size(value for state in optimizer.state.values() for value in state.values()),
    }


STRATEGY = FSDP

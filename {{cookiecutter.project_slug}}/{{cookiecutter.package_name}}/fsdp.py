"""strategy=fsdp: parameters, gradients and optimizer state sharded over the ranks (FSDP2).

`fully_shard` is applied to each block (the unit whose parameters are gathered for its forward
and freed after it), then to the root. The blocks are the module classes `fsdp.blocks` names,
or else the model's own repeated units: a transformer's blocks, a ResNet's stages. Parameters
become DTensors sharded on dim 0; the optimizer, built afterwards, steps on the local shards.
Mixed precision follows trainer.precision: bf16 gathers parameters in bf16 and reduces
gradients in fp32 (no autocast: the policy casts).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch
from torch import nn

from .config import FSDPConfig, TrainConfig, require

log = logging.getLogger(__name__)


def find_blocks(model: nn.Module, class_names: list[str]) -> list[nn.Module]:
    """The modules to shard one by one: those of the named classes, else the model's repeated units
    (the items of its ModuleLists, a torchvision ResNet's layer1..layer4)."""
    if class_names:
        return [module for module in model.modules() if type(module).__name__ in class_names]
    stages = [getattr(model, name, None) for name in ("layer1", "layer2", "layer3", "layer4")]
    if all(isinstance(stage, nn.Module) for stage in stages):
        return stages
    return [item for module in model.modules() if isinstance(module, nn.ModuleList) for item in module]


def check_offload(config: TrainConfig, use_cuda: bool) -> None:
    """CPU offload moves the shards from the GPU: on CPUs there is nothing to move."""
    require(
        not (config.strategy == "fsdp" and config.fsdp.cpu_offload and not use_cuda),
        "fsdp.cpu_offload=true moves the shards off the GPUs, and this job runs on CPUs, where they are already: "
        "drop it (or run on GPUs)",
    )


def shard_model(model: nn.Module, config: FSDPConfig, precision: str, world_size: int) -> nn.Module:
    """fully_shard the blocks, then the root, over a 1-D mesh of all ranks (in place; returned)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (world_size,))
    options: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": config.reshard_after_forward,
        "offload_policy": CPUOffloadPolicy() if config.cpu_offload else OffloadPolicy(),
    }
    bf16 = precision == "bf16"
    if bf16:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    blocks = find_blocks(model, config.blocks)
    for block in blocks:
        fully_shard(block, **options)
    if bf16:  # the loss in fp32, as autocast would compute it
        options["mp_policy"] = MixedPrecisionPolicy(torch.bfloat16, torch.float32, output_dtype=torch.float32)
    fully_shard(model, **options)
    log.info("fsdp: %d blocks sharded (%s) over %d ranks, then the root", len(blocks),
             ", ".join(sorted({type(block).__name__ for block in blocks})) or "none", world_size)  # fmt: skip
    return model


def is_sharded(model: nn.Module) -> bool:
    """Whether fully_shard made this an FSDP module (without importing FSDP, 0.8 s, when unused)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: the local shard of a DTensor, the tensor itself otherwise."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full_state_dict(model: nn.Module, rank_zero_only: bool = False) -> dict[str, torch.Tensor]:
    """The whole, unsharded model state under the plain model's names (a collective when sharded).
    Sharded and `rank_zero_only`: gathered on rank 0 only, in CPU memory (the others get {})."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=rank_zero_only)
    return get_model_state_dict(model, options=options)


def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Model and optimizer state keyed by parameter names, each tensor as it lives: this rank's
    shards under fsdp, whole tensors otherwise. What DCP saves and loads into."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}


def load_sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """The inverse of sharded_state()."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, Any],
                    optimizer_state: dict[str, Any]) -> None:  # fmt: skip
    """A ddp checkpoint's whole model and optimizer state (the optimizer's keyed by parameter
    number, as torch.optim saves it) into a sharded model: each rank keeps its shards."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, weights, options=options)
    names = {parameter: name for name, parameter in model.named_parameters()}
    order = [names[parameter] for group in optimizer.param_groups for parameter in group["params"]]
    by_name = {
        "state": {order[number]: state for number, state in optimizer_state["state"].items()},
        "param_groups": [
            {**group, "params": [order[number] for number in group["params"]]}
            for group in optimizer_state["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=options)


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

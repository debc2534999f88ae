"""Gradient compression through DDP communication hooks (`ddp.comm_hook`: fp16, bf16, powersgd), and PowerSGD's
memory as a checkpoint's part, so that a resumed run continues as the uninterrupted one (docs/communication.md).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from ...common.placement import DistEnv
from ...config import DDPConfig

log = logging.getLogger(__name__)


def register_comm_hook(model: nn.Module, config: DDPConfig, env: DistEnv) -> Any:
    """Register the configured hook on the DDP model; return the PowerSGD hook (for checkpoints) or None."""
    if config.comm_hook == "none" or not isinstance(model, DistributedDataParallel):
        return None
    log.info("DDP communication hook: %s", config.comm_hook)
    if config.comm_hook in ("fp16", "bf16"):
        compress = default_hooks.fp16_compress_hook if config.comm_hook == "fp16" else default_hooks.bf16_compress_hook
        model.register_comm_hook(None, compress)
        return None
    state = powerSGD_hook.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=config.powersgd_rank,
        start_powerSGD_iter=config.powersgd_start_iter,
    )
    hook = PowerSGDHook(state, model.module, env)
    model.register_comm_hook(state, hook.run)
    return hook


Layout = list[tuple[str, torch.Size]]  # the parameters of one gradient bucket, in bucket order


class PowerSGDHook:
    """torch's PowerSGD hook, its memory kept per parameter: PowerSGD keys its error feedback and warm-start memory
    by bucket, and DDP lays its buckets out anew early in every process (a resumed one too), so the memory is re-cut
    whenever a bucket's parameters change and saved per parameter."""

    def __init__(self, state: Any, module: nn.Module, env: DistEnv) -> None:
        self.state, self.env = state, env
        self.names = {param.data_ptr(): name for name, param in module.named_parameters()}
        self.layouts: dict[int, Layout] = {}
        self.restored: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] = ({}, {})

    # No annotations here: DDP inspects them, and with postponed evaluation they are strings.
    def run(self, state, bucket):  # noqa: ANN001, ANN201
        """The hook DDP calls for each bucket: re-cut the memory if the layout changed, then PowerSGD."""
        layout = [(self.names[p.data_ptr()], p.shape) for p in bucket.parameters()]
        if self.layouts.get(bucket.index()) != layout:
            self.relayout(bucket.index(), layout, bucket.buffer())
        return powerSGD_hook.powerSGD_hook(state, bucket)

    def compressed(self, layout: Layout) -> list[tuple[str, int, int]]:
        """(name, rows, rank) of the tensors PowerSGD compresses, in the order of its memory."""
        by_shape: dict[tuple[int, int], list[str]] = {}
        for name, shape in layout:
            rows, cols = shape[0], shape.numel() // max(shape[0], 1)
            rank = min(rows, cols, self.state.matrix_approximation_rank)
            if powerSGD_hook._should_compress(rows, cols, rank, self.state.min_compression_rate)[0]:
                by_shape.setdefault((rows, cols), []).append(name)
        return [(name, rows, min(rows, cols, self.state.matrix_approximation_rank))
                for (rows, cols), names in by_shape.items() for name in names]  # fmt: skip

    def per_parameter(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(error feedback, warm-start Q) per parameter name, from the buckets' memory."""
        errors, qs = dict(self.restored[0]), dict(self.restored[1])
        for index, layout in self.layouts.items():
            if index in self.state.error_dict:
                sizes = [shape.numel() for _, shape in layout]
                chunks = self.state.error_dict[index].split(sizes)
                errors.update({name: chunk for (name, _), chunk in zip(layout, chunks, strict=True)})
            if index in self.state.q_memory_dict:
                offset = 0
                shapes = dict(layout)
                for name, rows, rank in self.compressed(layout):
                    size = (shapes[name].numel() // rows) * rank
                    qs[name] = self.state.q_memory_dict[index][offset : offset + size]
                    offset += size
        return errors, qs

    def relayout(self, index: int, layout: Layout, buffer: torch.Tensor) -> None:
        errors, qs = self.per_parameter()
        names = [name for name, _ in layout]
        if all(name in errors for name in names):
            self.state.error_dict[index] = torch.cat([errors[name].reshape(-1) for name in names]).to(buffer)
        else:
            self.state.error_dict.pop(index, None)
        compressed = self.compressed(layout)
        if compressed and all(name in qs for name, _, _ in compressed):
            self.state.q_memory_dict[index] = torch.cat([qs[name] for name, _, _ in compressed]).to(buffer)
            p_size = sum(rows * rank for _, rows, rank in compressed)
            self.state.p_memory_dict[index] = torch.empty(p_size, dtype=buffer.dtype, device=buffer.device)
        else:
            self.state.q_memory_dict.pop(index, None)
            self.state.p_memory_dict.pop(index, None)
        self.layouts[index] = layout

    def state_dict(self) -> dict[str, Any] | None:
        """Tensors and plain values, every rank's error feedback gathered on rank 0 (a collective; None elsewhere)."""
        errors, qs = self.per_parameter()
        errors_per_rank: list[dict[str, torch.Tensor]] = [{} for _ in range(self.env.world_size)]
        for name in sorted(errors):
            gathered = (
                [torch.empty_like(errors[name]) for _ in range(self.env.world_size)] if self.env.is_main else None
            )
            dist.gather(errors[name].contiguous(), gathered, dst=0)
            for rank, tensor in enumerate(gathered or []):
                errors_per_rank[rank][name] = tensor
        if not self.env.is_main:
            return None
        generator, keys, position, has_gauss, cached_gaussian = self.state.rng.get_state()
        return {
            "iter": self.state.iter,
            "error_per_rank": errors_per_rank,
            "q_memory": qs,
            "rng": {
                "generator": str(generator),
                "keys": torch.from_numpy(keys.astype(np.int64)),
                "position": int(position),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached_gaussian),
            },
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        rng = saved["rng"]
        self.state.rng.set_state(
            (rng["generator"], rng["keys"].numpy().astype(np.uint32), rng["position"], rng["has_gauss"],
             rng["cached_gaussian"])
        )  # fmt: skip
        self.state.iter = saved["iter"]
        errors = saved["error_per_rank"]
        if len(errors) != self.env.world_size:
            log.warning(
                "PowerSGD error feedback was saved by %d ranks, now %d: it starts again from zero",
                len(errors), self.env.world_size,
            )  # fmt: skip
        mine = errors[self.env.rank] if len(errors) == self.env.world_size else {}
        self.restored = (mine, dict(saved["q_memory"]))


def hook_state_dict(hook: Any) -> dict[str, Any] | None:
    """The checkpoint entry of the registered hook (a collective for PowerSGD; None otherwise)."""
    return hook.state_dict() if isinstance(hook, PowerSGDHook) else None


def load_hook_state(hook: Any, saved: dict[str, Any] | None) -> None:
    """Give the registered hook its checkpointed memory (PowerSGD's; the others have none)."""
    if isinstance(hook, PowerSGDHook) and saved is not None:
        hook.load_state_dict(saved)

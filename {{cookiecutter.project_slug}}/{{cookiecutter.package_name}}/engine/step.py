"""One optimizer step: mixed precision, channels_last, gradient accumulation and clipping.

A step runs `grad_accum_steps` micro-batches. Every backward but the last runs with the strategy's
gradient reduction off (DDP's `no_sync()`, FSDP's gradient sync), so gradients are reduced once per
optimizer step, over the sum of all the micro-batches' gradients: the gradient of one big batch, at
the memory cost of a small one.
Nothing here reads a value back to the host: the loss stays on the device until the log line.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ..config import TrainerConfig
from ..tasks import Classification
from .batch import model_forward, to_device

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def use_deterministic_kernels(enabled: bool) -> None:
    """trainer.deterministic: the GPU kernels that make a resume bit-exact there.

    CPU results are bit-exact without it (the launch scripts set MKL_CBWR). On GPUs, atomics in
    some kernels, cuBLAS's workspace choice and cuDNN's benchmark-picked algorithms vary from run
    to run; this turns all three off. Call before the first cuBLAS use: it reads the workspace
    setting when it creates its handle.
    """
    if not enabled:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


class StepRunner:
    """Forward and backward of micro-batches, then the optimizer step, as the trainer config says; the
    strategy says how gradients are reduced, whether autocast casts, and what follows each step."""

    def __init__(
        self,
        trained: nn.Module,
        optimizer: torch.optim.Optimizer,
        config: TrainerConfig,
        device: torch.device,
        world_size: int,
        task: Any = None,  # the loss per sample (tasks.py); classification when None
        strategy: Any = None,  # strategies/: gradient_sync, after_step, autocasts; a plain model when None
    ) -> None:
        self.trained, self.optimizer, self.device, self.world_size = trained, optimizer, device, world_size
        self.task = task if task is not None else Classification()
        self.strategy = strategy
        self.dtype = AUTOCAST_DTYPES[config.precision] if strategy is None or strategy.autocasts else None
        self.memory_format = torch.channels_last if config.channels_last else torch.contiguous_format
        self.clip_grad_norm = config.clip_grad_norm
        self.params = [p for group in optimizer.param_groups for p in group["params"]]  # what clipping sees
        # fp16's narrow range needs loss scaling; bf16 has fp32's range and does not.
        self.scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def micro_step(
        self, inputs: Any, targets: Any, weights: torch.Tensor, real_samples: int, sync: bool
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch (`sync` on the last one of the step only); its
        share of the step's loss, on the device: the step's loss is the sum of its micro-batches'."""
        inputs = to_device(inputs, self.device, self.memory_format)
        targets = to_device(targets, self.device)
        weights = weights.to(self.device, non_blocking=True)
        with self.gradient_sync(sync):
            with self.autocast():
                outputs = model_forward(self.trained, inputs)
            per_sample = self.task.loss(outputs, targets)
            # DDP averages gradients over ranks; scaling by world_size / real_samples makes that
            # average the mean over exactly the real samples of the step's global batch (all its
            # micro-batches), also when the last one is short or uneven: padding (weight 0) adds nothing.
            loss = (per_sample * weights).sum() * (self.world_size / real_samples)
            self.scaler.scale(loss).backward()
        return loss.detach()

    def gradient_sync(self, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        """Gradients reduced over the ranks in this backward only if `enabled` (the step's last)."""
        if self.strategy is None:
            return contextlib.nullcontext()
        return self.strategy.gradient_sync(self.trained, enabled)

    def optimizer_step(self) -> torch.Tensor:
        """Clip, step, clear the gradients; then what the strategy does after a step. The gradients'
        global norm before clipping, on the device (read back with the interval's log line only)."""
        if self.scaler.is_enabled():  # fp16: the norm of the true gradients (step() knows they are unscaled)
            self.scaler.unscale_(self.optimizer)
        if self.clip_grad_norm > 0:
            norm = nn.utils.clip_grad_norm_(self.params, self.clip_grad_norm)
        else:  # the same norm clipping computes (frozen parameters have no gradient: left out)
            norm = nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
        if isinstance(norm, DTensor):  # sharded gradients (fsdp): the norm over every rank's shards
            norm = norm.full_tensor()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.strategy is not None:
            self.strategy.after_step()
        return norm.detach()

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's `grad_scaler`: fp16's loss scale; empty otherwise."""
        return {"grad_scaler": self.scaler.state_dict() if self.scaler.is_enabled() else {}}

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        if payload["grad_scaler"] and self.scaler.is_enabled():
            self.scaler.load_state_dict(payload["grad_scaler"])

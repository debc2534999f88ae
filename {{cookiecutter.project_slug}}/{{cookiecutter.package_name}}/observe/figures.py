"""The log line's figures beyond loss and learning rate: tokens/s, peak memory and, on GPUs, MFU
(docs/callbacks.md). They are read on the host once per log line: nothing is added to a step.
"""

from __future__ import annotations

import resource
import sys
from typing import Any

import torch

from ..tasks import Task

# Peak dense (no sparsity) bf16 tensor-core FLOP/s, from the vendors' data sheets (SXM where two exist).
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "A10G": 70e12,
    "A10": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
}


def peak_flops(device: torch.device) -> float | None:
    """The GPU's peak bf16 FLOP/s from the table; None on CPUs and for GPUs it does not list."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def peak_memory_mb(device: torch.device) -> float:
    """This process's peak memory in MiB: the device's allocations on GPUs, the resident set on CPUs."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


class Throughput:
    """What the figures need to know of the task and the model, learnt from the first micro-batch."""

    def __init__(self) -> None:
        self.tokens_per_sample: int | None = None  # 0: the task does not count tokens
        self.flops_per_token: float | None = None
        self.peak: float | None = None

    def count_tokens(self, task: Task, targets: Any, model: torch.nn.Module) -> None:
        counter = getattr(task, "tokens_per_sample", None)
        self.tokens_per_sample = int(counter(targets)) if callable(counter) else 0
        flops = getattr(model, "flops_per_token", None)
        if self.tokens_per_sample and callable(flops):
            self.flops_per_token = float(flops(self.tokens_per_sample))
            self.peak = peak_flops(next(model.parameters()).device)

    def figures(self, samples_per_s: float, env: Any) -> dict[str, float]:
        figures = {"peak_memory_mb": peak_memory_mb(env.device)}
        if self.tokens_per_sample:
            tokens_per_s = samples_per_s * self.tokens_per_sample
            figures["tokens_per_s"] = tokens_per_s
            if self.flops_per_token and self.peak:
                figures["mfu"] = tokens_per_s * self.flops_per_token / (env.world_size * self.peak)
        return figures

"""The learning-rate schedule: linear warm-up, then cosine (or constant), for any optimizer.

The schedule is a function of training progress counted in samples, not in optimizer steps,
so it is the same curve whatever the world size, also after resuming on another one. The
optimizer itself is built from `optim._target_` (components.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch


def lr_at(optim: dict[str, Any], progress_epochs: float, total_epochs: int) -> float:
    """The learning rate after `progress_epochs` epochs (fractional) of `total_epochs`."""
    peak, warmup = optim["lr"], optim.get("warmup_epochs", 0.0)
    if warmup > 0 and progress_epochs < warmup:
        return peak * progress_epochs / warmup
    if optim.get("scheduler", "cosine") == "constant":
        return peak
    span = max(total_epochs - warmup, 1e-12)
    fraction = min(max((progress_epochs - warmup) / span, 0.0), 1.0)
    return peak * 0.5 * (1.0 + math.cos(math.pi * fraction))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr

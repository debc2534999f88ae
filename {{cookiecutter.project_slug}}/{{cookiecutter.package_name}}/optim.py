"""Optimizers and the learning-rate schedule.

The schedule is a function of training progress counted in samples, not in optimizer steps,
so it is the same curve whatever the world size, also after resuming on another one.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import AdamWConfig, OptimConfig, SGDConfig


def build_optimizer(config: OptimConfig, model: nn.Module) -> torch.optim.Optimizer:
    # No weight decay on biases and normalisation weights, as is customary.
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if isinstance(config, SGDConfig):
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum, nesterov=config.nesterov)
    if isinstance(config, AdamWConfig):
        return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas))
    raise ValueError(f"unknown optimizer {config.name}")


def lr_at(config: OptimConfig, progress_epochs: float, total_epochs: int) -> float:
    """The learning rate after `progress_epochs` epochs (fractional) of `total_epochs`."""
    if config.warmup_epochs > 0 and progress_epochs < config.warmup_epochs:
        return config.lr * progress_epochs / config.warmup_epochs
    if config.scheduler == "constant":
        return config.lr
    span = max(total_epochs - config.warmup_epochs, 1e-12)
    fraction = min(max((progress_epochs - config.warmup_epochs) / span, 0.0), 1.0)
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * fraction))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr

"""The project's own models, and those of the modules beside this one (each its `BUILDABLE`). Any other
model is a `configs/model/*.yaml` whose `_target_` returns an nn.Module (`torchvision.models.resnet18`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..common.registry import buildable_beside, defined_beside


def conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class SmallCNN(nn.Sequential):
    """Three conv blocks, global pooling and a linear head: trains in seconds on CPUs."""

    def __init__(self, num_classes: int, width: int = 32) -> None:
        super().__init__(
            conv_block(3, width),
            nn.MaxPool2d(2),
            conv_block(width, 2 * width),
            nn.MaxPool2d(2),
            conv_block(2 * width, 4 * width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4 * width, num_classes),
        )


class MixtureOfExperts(nn.Module):
    """A model that returns (logits, aux): `experts` MLPs mixed by a softmax gate, and the gate's load-balance
    term (1 where the experts are used equally, up to `experts` where one takes all): tasks.ClassificationWithAux."""

    def __init__(self, in_features: int, num_classes: int, experts: int = 4, width: int = 64) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.gate = nn.Linear(in_features, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(in_features, width), nn.ReLU(), nn.Linear(width, width)) for _ in range(experts)
        )
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.flatten(x)
        gates = self.gate(x).softmax(dim=-1)  # (batch, experts)
        mixed = sum(gates[:, i, None] * expert(x) for i, expert in enumerate(self.experts))
        balance = len(self.experts) * gates.mean(dim=0).square().sum()
        return self.head(torch.relu(mixed)), balance


def count_parameters(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


# What a checkpoint's config may build (engine/checkpoint/trust.py): add yours here, or a module's BUILDABLE.
BUILDABLE = (SmallCNN, MixtureOfExperts, *buildable_beside(__name__, __path__))


def __getattr__(name: str) -> Any:
    """`models.<Name>`: what a module beside this one defines, by the name configs and checkpoints give."""
    return defined_beside(__name__, __path__, name)

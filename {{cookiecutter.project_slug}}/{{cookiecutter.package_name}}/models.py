"""The models: a small CNN for quick runs and torchvision's ResNets."""

from __future__ import annotations

from torch import nn

from .config import ModelConfig, SmallCNNConfig


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


def build_model(config: ModelConfig, num_classes: int) -> nn.Module:
    """A freshly initialised model (initialisation follows torch's global seed)."""
    if isinstance(config, SmallCNNConfig):
        return SmallCNN(num_classes, config.width)
    from torchvision import models

    return getattr(models, config.name)(weights=None, num_classes=num_classes)


def count_parameters(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())

"""What a batch is: inputs (a tensor, or a tuple or dict of tensors) and targets, as collated.

The model is called with the inputs: a tensor as the one argument, a tuple as the arguments, a
dict as keyword arguments. Nothing here reads a value back to the host.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def to_device(value: Any, device: torch.device, memory_format: torch.memory_format | None = None) -> Any:
    """Tensors (also inside tuples, lists and dicts) on `device`, without blocking; 4-d ones in
    `memory_format` when given (channels_last applies to image batches only)."""
    if isinstance(value, torch.Tensor):
        if memory_format is not None and value.dim() == 4:
            return value.to(device, non_blocking=True, memory_format=memory_format)
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {key: to_device(item, device, memory_format) for key, item in value.items()}
    if isinstance(value, list | tuple):
        items = [to_device(item, device, memory_format) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # a namedtuple's fields
    return value


def model_forward(model: nn.Module, inputs: Any) -> Any:
    """The model on one batch's inputs."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, list | tuple):
        return model(*inputs)
    return model(inputs)

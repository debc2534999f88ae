"""What a batch is (Batch), how it reaches the device and the model; and the built-in `data.collate`s for
inputs that do not stack (docs/configuration.md, "Items that do not stack: data.collate")."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import default_collate


class Batch(NamedTuple):
    """A batch as the loaders give it (an item is one too: torch's default_collate keeps the type)."""

    inputs: Any  # a tensor, or a tuple or dict of tensors, as the data set (or data.collate) gives them
    targets: Any  # what the task's loss and metrics take beside the model's outputs
    weights: torch.Tensor  # float64 (batch,): 1 for a real sample, 0 for the sampler's padding
    indices: torch.Tensor  # int64 (batch,): the samples' indices in their data set


def to_device(value: Any, device: torch.device, memory_format: torch.memory_format | None = None) -> Any:
    """Tensors (also inside tuples, lists and dicts) on `device`, without blocking; 4-d ones in `memory_format`."""
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
    """The model on one batch's inputs: a tensor its argument, a tuple its arguments, a dict its keywords."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, list | tuple):
        return model(*inputs)
    return model(inputs)


def pad_sequences(items: list[tuple[Any, Any]], pad_value: float = 0) -> tuple[tuple[torch.Tensor, torch.Tensor], Any]:
    """((padded, lengths), targets): each input (length, ...) padded at its end with `pad_value` to the batch's
    longest, lengths int64; targets collated as torch does."""
    inputs = [item[0] for item in items]
    if not all(isinstance(tensor, torch.Tensor) and tensor.dim() >= 1 for tensor in inputs):
        kinds = sorted({type(tensor).__name__ for tensor in inputs})
        raise TypeError(f"pad_sequences pads tensors of at least one dimension, got {', '.join(kinds)}")
    lengths = torch.tensor([len(tensor) for tensor in inputs], dtype=torch.int64)
    padded = pad_sequence(inputs, batch_first=True, padding_value=pad_value)
    return (padded, lengths), default_collate([item[1] for item in items])


def pad_windows(
    items: list[tuple[torch.Tensor, torch.Tensor]], pad_value: int = 0, ignore: int = -100
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of windows of different lengths (a target per position), padded at their end to the
    batch's longest: inputs with `pad_value`, targets with `ignore` (tasks.IGNORE), neither scored nor counted."""
    inputs = pad_sequence([item[0] for item in items], batch_first=True, padding_value=pad_value)
    targets = pad_sequence([item[1] for item in items], batch_first=True, padding_value=ignore)
    return inputs, targets


# What a checkpoint's config may build (engine/checkpoint/trust.py): add a collate of yours here.
BUILDABLE = (pad_sequences, pad_windows)

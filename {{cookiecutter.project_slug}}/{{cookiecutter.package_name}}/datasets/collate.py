"""A built-in `data.collate`: items whose inputs do not stack (sequences of different lengths).

A `data.collate._target_` is a function called with a batch's list of (input, target) items (the
node's other keys as keyword arguments) that returns (inputs, targets), in any structure the
model and the task take (docs/configuration.md, "Items that do not stack: data.collate").
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import default_collate


def pad_sequences(items: list[tuple[Any, Any]], pad_value: float = 0) -> tuple[tuple[torch.Tensor, torch.Tensor], Any]:
    """((padded, lengths), targets): each input, a tensor of shape (length, ...), padded at the end with
    `pad_value` to the longest of the batch: padded (batch, longest, ...), lengths (batch,) int64; the
    model is called as model(padded, lengths). Targets are collated as torch does (ints: an int64 tensor).
    The mask of real positions is `torch.arange(padded.shape[1]) < lengths[:, None]`."""
    inputs = [item[0] for item in items]
    if not all(isinstance(tensor, torch.Tensor) and tensor.dim() >= 1 for tensor in inputs):
        kinds = sorted({type(tensor).__name__ for tensor in inputs})
        raise TypeError(f"pad_sequences pads tensors of at least one dimension, got {', '.join(kinds)}")
    lengths = torch.tensor([len(tensor) for tensor in inputs], dtype=torch.int64)
    padded = pad_sequence(inputs, batch_first=True, padding_value=pad_value)
    return (padded, lengths), default_collate([item[1] for item in items])

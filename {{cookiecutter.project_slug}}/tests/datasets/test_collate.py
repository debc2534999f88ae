"""datasets/collate.py: pad_sequences, the built-in data.collate for inputs of different lengths."""

from __future__ import annotations

import pytest
import torch

from {{cookiecutter.package_name}}.datasets import pad_sequences


def test_inputs_are_padded_at_their_end_to_the_longest_with_their_lengths() -> None:
    items = [(torch.tensor([3, 4]), 1), (torch.tensor([5, 6, 7, 8]), 0), (torch.tensor([9]), 2)]
    (padded, lengths), targets = pad_sequences(items, pad_value=-1)
    assert torch.equal(padded, torch.tensor([[3, 4, -1, -1], [5, 6, 7, 8], [9, -1, -1, -1]]))
    assert lengths.dtype == torch.int64 and lengths.tolist() == [2, 4, 1]
    assert targets.dtype == torch.int64 and targets.tolist() == [1, 0, 2]
    mask = torch.arange(padded.shape[1]) < lengths[:, None]  # as the docstring says
    assert torch.equal(padded[mask], torch.tensor([3, 4, 5, 6, 7, 8, 9]))


def test_only_the_leading_dimension_varies_and_is_padded() -> None:
    items = [(torch.ones(2, 3), torch.tensor(1.0)), (torch.ones(5, 3), torch.tensor(2.0))]
    (padded, lengths), targets = pad_sequences(items)
    assert padded.shape == (2, 5, 3) and padded[0, 2:].eq(0).all() and padded[1].eq(1).all()
    assert lengths.tolist() == [2, 5] and targets.tolist() == [1.0, 2.0]


def test_inputs_that_are_not_sequences_are_refused() -> None:
    with pytest.raises(TypeError, match="pad_sequences pads tensors of at least one dimension, got Tensor, int"):
        pad_sequences([(torch.tensor(3), 0), (7, 1)])

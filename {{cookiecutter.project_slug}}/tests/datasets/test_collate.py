"""datasets/collate.py: what a batch is (a Batch survives default_collate), its tensors moved to the device
wherever they sit, the model called with its inputs; pad_sequences, the built-in data.collate."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
from torch import nn
from torch.utils.data import default_collate

from {{cookiecutter.package_name}}.datasets import pad_sequences
from {{cookiecutter.package_name}}.datasets.collate import Batch, model_forward, to_device

META = torch.device("meta")  # a real second device on any machine: tensors there keep shape and dtype


def test_items_collate_into_one_batch_of_tensors() -> None:
    items = [Batch(torch.ones(2), 1, 1.0, 4), Batch(torch.zeros(2), 0, 0.0, 9)]
    batch = default_collate(items)
    assert isinstance(batch, Batch) and batch.inputs.shape == (2, 2) and batch.targets.tolist() == [1, 0]
    assert batch.weights.dtype == torch.float64 and batch.indices.tolist() == [4, 9]


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


def test_every_tensor_moves_inside_tuples_lists_and_dicts_and_the_rest_stays() -> None:
    batch = (torch.ones(2, 3), [torch.zeros(2), {"mask": torch.ones(2, dtype=torch.bool), "name": "x"}], 7)
    moved = to_device(batch, META)
    assert type(moved) is tuple and type(moved[1]) is list and type(moved[1][1]) is dict
    images, (labels, extra), count = moved
    assert images.device == labels.device == extra["mask"].device == META
    assert (images.shape, labels.shape, extra["mask"].dtype) == ((2, 3), (2,), torch.bool)
    assert extra["name"] == "x" and count == 7


def test_named_tuple_inputs_as_default_collate_makes_them_move_and_stay_named() -> None:
    Inputs = namedtuple("Inputs", ["ids", "mask"])  # noqa: PYI024
    batch = default_collate([(Inputs(torch.ones(3), torch.ones(3)), 0), (Inputs(torch.zeros(3), torch.ones(3)), 1)])
    inputs, _ = batch
    assert type(inputs) is Inputs
    moved = to_device(inputs, META)
    assert type(moved) is Inputs and moved.ids.device == moved.mask.device == META


def test_only_four_dimensional_tensors_take_the_memory_format() -> None:
    images, tokens = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4)
    moved_images, moved_tokens = to_device((images, tokens), torch.device("cpu"), torch.channels_last)
    assert moved_images.is_contiguous(memory_format=torch.channels_last)
    assert not images.is_contiguous(memory_format=torch.channels_last), "the original untouched"
    assert torch.equal(moved_images, images) and moved_tokens.is_contiguous()
    assert not to_device(images, torch.device("cpu")).is_contiguous(memory_format=torch.channels_last)


class Recorder(nn.Module):
    def forward(self, *args: object, **kwargs: object) -> tuple[tuple[object, ...], dict[str, object]]:
        return args, kwargs


def test_a_tensor_is_the_one_argument_a_tuple_the_arguments_a_dict_the_keywords() -> None:
    model, x, y = Recorder(), torch.ones(1), torch.zeros(1)
    assert model_forward(model, x) == ((x,), {})
    assert model_forward(model, (x, y)) == ((x, y), {})
    assert model_forward(model, [x, y]) == ((x, y), {})
    args, kwargs = model_forward(model, {"input_ids": x, "attention_mask": y})
    assert args == () and kwargs == {"input_ids": x, "attention_mask": y}

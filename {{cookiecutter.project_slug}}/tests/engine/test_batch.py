"""batch.py: a batch's tensors moved to the device wherever they sit, and the model called with its inputs."""

from __future__ import annotations

from collections import namedtuple

import torch
from torch import nn
from torch.utils.data import default_collate

from {{cookiecutter.package_name}}.engine.batch import model_forward, to_device

META = torch.device("meta")  # a real second device on any machine: tensors there keep shape and dtype


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

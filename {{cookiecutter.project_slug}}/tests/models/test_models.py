"""models/: the small CNN's shapes, parameter counts, and the models of the modules beside it found by their
old names."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from {{cookiecutter.package_name}} import models
from {{cookiecutter.package_name}}.models import SmallCNN, count_parameters


@pytest.mark.parametrize(("height", "width"), [(32, 32), (20, 24), (64, 48)])
def test_the_small_cnn_gives_one_logit_per_class_for_images_of_any_size(height: int, width: int) -> None:
    model = SmallCNN(num_classes=7, width=8).eval()
    assert model(torch.randn(5, 3, height, width)).shape == (5, 7)


def test_the_small_cnn_has_the_parameters_of_three_conv_blocks_and_a_head() -> None:
    # conv 3->32, 32->64, 64->128 (3x3, no bias) with their BatchNorm scales and shifts, then 128->10
    expected = (3 * 32 + 32 * 64 + 64 * 128) * 9 + 2 * (32 + 64 + 128) + 128 * 10 + 10
    assert count_parameters(SmallCNN(num_classes=10)) == expected == 94762


def test_count_parameters_counts_each_shared_parameter_once() -> None:
    shared = nn.Linear(3, 4)  # 12 weights and 4 biases
    assert count_parameters(nn.Sequential(shared, nn.ReLU(), nn.Linear(4, 2))) == 16 + 10
    assert count_parameters(nn.Sequential(shared, shared)) == 16


def test_a_model_of_a_module_beside_is_found_by_its_old_name_and_registered() -> None:
    # configs and saved checkpoints name a model of a module beside models.<Name>: wherever models/ keeps it,
    # that name finds it (the modules beside: their own test files)
    found = {model.__name__: model for model in models.BUILDABLE}
    assert {"SmallCNN", "MixtureOfExperts"} <= found.keys()
    for name, model in found.items():
        assert getattr(models, name) is model
    with pytest.raises(AttributeError, match="module '{{cookiecutter.package_name}}.models' has no attribute 'Nope'"):
        models.Nope  # noqa: B018

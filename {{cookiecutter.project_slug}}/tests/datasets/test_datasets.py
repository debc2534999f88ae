"""datasets/__init__.py: the data sets found by what is present, by the names the configs give."""

from __future__ import annotations

import pytest

from {{cookiecutter.package_name}} import datasets
from {{cookiecutter.package_name}}.datasets import collate, images


def test_each_module_registers_its_data_sets_and_they_keep_the_names_the_configs_give() -> None:
    assert {images.synthetic_images, images.cifar10, images.image_folder} <= set(datasets.BUILDABLE)
    assert set(collate.BUILDABLE) <= set(datasets.BUILDABLE)
    for built in datasets.BUILDABLE:  # datasets.synthetic_images: a module's, by the package's name
        assert getattr(datasets, built.__name__) is built
    assert datasets.TensorImages is images.TensorImages, "a public class of a module, too"


def test_a_name_no_module_defines_is_an_attribute_error() -> None:
    for name in ("Nope", "torch", "_private", "Path"):  # imported by a module, or private: not the package's
        with pytest.raises(AttributeError, match=f"module '{datasets.__name__}' has no attribute '{name}'"):
            getattr(datasets, name)

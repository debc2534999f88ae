"""Augmentation: each image's crop and flip come from its (seed, epoch, index), in a batch or alone."""

from __future__ import annotations

import pytest
import torch

from {{cookiecutter.package_name}}.augment import CROP_PADDING, augment, augment_batch
from {{cookiecutter.package_name}}.datasets.randomness import as_int64, sample_seed

INDICES = [*range(200), 1000, 2**31 + 5, 49999, 123456789, 2**40 + 3]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def reference(image: torch.Tensor, seed: int, epoch: int, index: int) -> torch.Tensor:
    """The documented augmentation, written out: zero padding 4, then the crop and flip drawn."""
    draw = sample_seed(seed, epoch, index)
    dy, dx, flip = draw % 9, (draw >> 8) % 9, (draw >> 16) & 1
    height, width = image.shape[-2:]
    padded = torch.zeros(*image.shape[:-2], height + 8, width + 8, dtype=image.dtype)
    padded[..., 4 : 4 + height, 4 : 4 + width] = image
    crop = padded[..., dy : dy + height, dx : dx + width]
    return crop.flip(-1) if flip else crop


@pytest.mark.parametrize(("seed", "epoch"), [(11, 5), (0, 0), (2**40 + 7, 123)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_each_image_gets_the_crop_and_flip_drawn_from_its_key(seed: int, epoch: int, dtype: torch.dtype) -> None:
    assert CROP_PADDING == 4
    generator = torch.Generator().manual_seed(0)
    images = (torch.rand(len(INDICES), 3, 6, 7, generator=generator) * 255 + 1).to(dtype)  # no zero pixels
    indices = torch.tensor(INDICES)
    batch = augment_batch(images, seed, epoch, indices)
    expected = torch.stack([reference(image, seed, epoch, i) for image, i in zip(images, INDICES, strict=True)])
    assert batch.dtype == dtype and batch.shape == images.shape
    assert torch.equal(batch, expected)
    one_by_one = torch.stack([augment(image, seed, epoch, i) for image, i in zip(images, INDICES, strict=True)])
    assert torch.equal(one_by_one, batch), "the same on a batch as one by one"
    shuffled = torch.randperm(len(INDICES), generator=generator)
    assert torch.equal(augment_batch(images[shuffled], seed, epoch, indices[shuffled]), batch[shuffled])
    draws = [sample_seed(seed, epoch, i) for i in INDICES]
    assert {d % 9 for d in draws} == {(d >> 8) % 9 for d in draws} == set(range(9)), "every crop offset met"
    assert {(d >> 16) & 1 for d in draws} == {0, 1}, "flipped and not"
    assert any(as_int64(d) % 9 != d % 9 for d in draws), "draws whose crop a signed modulo would get wrong"


@CUDA
def test_on_a_cuda_device_the_batch_gets_the_same_crops_and_flips() -> None:
    images = torch.rand(len(INDICES), 3, 6, 7, generator=torch.Generator().manual_seed(0))
    indices = torch.tensor(INDICES)
    on_device = augment_batch(images.cuda(), 11, 5, indices.cuda())
    assert on_device.is_cuda and torch.equal(on_device.cpu(), augment_batch(images, 11, 5, indices))


@pytest.mark.parametrize("shape", [(6, 7), (3, 6, 7), (2, 3, 6, 7)])
def test_an_image_of_any_leading_dims_is_cropped_on_its_last_two(shape: tuple[int, ...]) -> None:
    image = torch.rand(shape, generator=torch.Generator().manual_seed(1)) + 1
    for index in range(20):
        assert torch.equal(augment(image, 3, 4, index), reference(image, 3, 4, index))


def test_augmentation_is_a_function_of_seed_epoch_and_index() -> None:
    image = torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(augment(image, 1, 2, 3), augment(image, 1, 2, 3))
    variants = {augment(image, 1, epoch, 3).sum().item() for epoch in range(20)}
    assert len(variants) > 5, "the epoch must change the crop and flip"
    assert augment(image, 1, 2, 3).shape == image.shape

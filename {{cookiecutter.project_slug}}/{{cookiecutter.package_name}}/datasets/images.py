"""The built-in image data sets: `synthetic_images`, `cifar10` (its own python format), `image_folder`
(a folder per class); TensorImages, an in-memory set of uint8 images any data set may return; and
DeviceBatches, the training batches of such a set gathered on the device (`data.on_device`)."""

from __future__ import annotations

import itertools
import math
import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ..common.errors import ConfigError
from .collate import Batch


def normalise(images_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 pixels to floats of mean about 0 and spread about 1."""
    return (images_uint8.float() / 255.0 - 0.5) / 0.25


class TensorImages(Dataset):
    """Images in memory as one (N, C, H, W) tensor with integer labels (what `data.on_device` keeps on the GPU)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index]
        return (normalise(image) if image.dtype == torch.uint8 else image), int(self.labels[index])


def synthetic_images(
    num_classes: int, image_size: int, train_size: int, val_size: int, seed: int
) -> tuple[TensorImages, TensorImages]:
    """A learnable set made from the seed: smooth class prototypes plus per-sample noise."""
    for key, value, least in (("train_size", train_size, 1), ("val_size", val_size, 1), ("image_size", image_size, 8)):
        if value < least:
            raise ConfigError(f"data.{key} must be >= {least}, got {value}")
    coarse = torch.randn(num_classes, 3, 4, 4, generator=torch.Generator().manual_seed(seed))
    prototypes = F.interpolate(coarse, size=(image_size, image_size), mode="bilinear", align_corners=False)

    def draw(count: int, stream: int) -> TensorImages:
        rng = torch.Generator().manual_seed(seed * 1000 + stream)
        labels = torch.randint(num_classes, (count,), generator=rng)
        noise = torch.randn(count, 3, image_size, image_size, generator=rng)
        return TensorImages(prototypes[labels] * 0.2 + noise, labels)

    return draw(train_size, 1), draw(val_size, 2)


CIFAR_DIR = "cifar-10-batches-py"
CIFAR_TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
CIFAR_TEST_FILES = ["test_batch"]


class CifarUnpickler(pickle.Unpickler):
    """Builds only what CIFAR-10's pickles hold (dicts, lists, NumPy arrays): a doctored file runs nothing."""

    FORMAT = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
              ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}  # fmt: skip

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.FORMAT:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of CIFAR-10's format")
        return super().find_class(module, name)


def read_cifar_batches(folder: Path, names: Sequence[str]) -> TensorImages:
    """CIFAR-10's python format: pickled dicts of uint8 rows (3x32x32) and labels."""
    images, labels = [], []
    for name in names:
        with open(folder / name, "rb") as file:
            try:
                batch = CifarUnpickler(file, encoding="latin1").load()  # the data set's own format
            except pickle.UnpicklingError as error:
                raise ConfigError(f"{folder / name}: not CIFAR-10's python format ({error}): fetch it again") from None
        images.append(torch.as_tensor(batch["data"], dtype=torch.uint8).reshape(-1, 3, 32, 32))
        labels.append(torch.as_tensor(batch["labels"], dtype=torch.long))
    return TensorImages(torch.cat(images), torch.cat(labels))


def cifar10(root: str, download: bool = False, image_size: int = 32) -> tuple[TensorImages, TensorImages]:
    """CIFAR-10 in its python format under root/cifar-10-batches-py/; downloaded only if asked."""
    if image_size != 32:
        raise ConfigError(f"data.image_size={image_size} but cifar10 images are 32x32")
    folder = Path(root) / CIFAR_DIR
    missing = [name for name in CIFAR_TRAIN_FILES + CIFAR_TEST_FILES if not (folder / name).is_file()]
    if missing and not download:
        raise ConfigError(
            f"CIFAR-10 not found: {folder} lacks {', '.join(missing)}; put the python-version files "
            f"there or set data.download=true"
        )
    if missing:
        from torchvision.datasets import CIFAR10

        CIFAR10(root, train=True, download=True)
    return read_cifar_batches(folder, CIFAR_TRAIN_FILES), read_cifar_batches(folder, CIFAR_TEST_FILES)


def image_folder(root: str, image_size: int, num_classes: int) -> tuple[Dataset, Dataset]:
    """A local tree root/train/<class>/* and root/val/<class>/*, resized to image_size."""
    from torchvision import datasets, transforms

    for split in ("train", "val"):
        check_image_tree(Path(root) / split, num_classes)
    transform = transforms.Compose([transforms.Resize((image_size, image_size)), transforms.PILToTensor(), normalise])
    train, val = (datasets.ImageFolder(str(Path(root) / split), transform=transform) for split in ("train", "val"))
    if train.classes != val.classes or len(train.classes) != num_classes:
        raise ConfigError(
            f"image_folder: train/ has {len(train.classes)} classes, val/ has {len(val.classes)}, "
            f"data.num_classes={num_classes}: make them agree"
        )
    return train, val


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def check_image_tree(folder: Path, num_classes: int) -> None:
    """Refuse, before any work, a split that ImageFolder would read wrongly or fail on mid-epoch."""
    if not folder.is_dir():
        raise ConfigError(f"image_folder: {folder} does not exist; set data.root to a folder with train/ and val/")
    classes = sorted(entry for entry in folder.iterdir() if entry.is_dir())
    if len(classes) != num_classes:
        raise ConfigError(
            f"image_folder: {folder} has {len(classes)} class folders, data.num_classes={num_classes}: make them agree"
        )
    for class_folder in classes:
        images = [entry for entry in os.scandir(class_folder) if entry.name.lower().endswith(IMAGE_SUFFIXES)]
        if not images:
            raise ConfigError(f"image_folder: {class_folder} holds no images ({', '.join(IMAGE_SUFFIXES[:3])}, ...): "
                              "add some or remove the folder")  # fmt: skip
        empty = next((entry.path for entry in images if entry.stat().st_size == 0), None)
        if empty is not None:
            raise ConfigError(f"image_folder: {empty} is an empty file: replace or remove it")


class DeviceBatches:
    """The training batches of `data.on_device`: gathered, normalised and augmented on the device from the
    sampler's (index, epoch, weight) keys, so they equal the DataLoader's without workers or copies."""

    def __init__(
        self,
        base: TensorImages,
        sampler: Any,
        seed: int,
        transform: Callable[[torch.Tensor, int, int, torch.Tensor], torch.Tensor] | None,
        device: torch.device,
    ) -> None:
        self.images, self.labels = base.images.to(device), base.labels.to(device)
        self.sampler, self.seed, self.transform, self.device = sampler, seed, transform, device

    def __len__(self) -> int:
        return math.ceil(len(self.sampler) / self.sampler.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        keys = iter(self.sampler)
        while chunk := list(itertools.islice(keys, self.sampler.batch_size)):
            indices = torch.tensor([index for index, _, _ in chunk])
            weights = torch.tensor([weight for _, _, weight in chunk], dtype=torch.float64)  # as collated
            on_device = indices.to(self.device, non_blocking=True)
            images = normalise(self.images[on_device]) if self.images.dtype == torch.uint8 else self.images[on_device]
            if self.transform is not None:
                images = self.transform(images, self.seed, self.sampler.epoch, on_device)
            yield Batch(images, self.labels[on_device], weights, indices)


# What a checkpoint's config may build (engine/checkpoint/trust.py), found by datasets/__init__.py.
BUILDABLE = (synthetic_images, cifar10, image_folder)

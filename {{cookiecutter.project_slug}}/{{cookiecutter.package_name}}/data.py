"""Data sets, the training sampler and the exact evaluation split.

Determinism is the contract here: an epoch's sample order is a function of (seed, epoch),
a sample's augmentation a function of (seed, epoch, index). Neither depends on the number of
processes or DataLoader workers, which is what lets a run resume bit-exactly, also on another
world size, and lets evaluation give the same figures at any world size.
"""

from __future__ import annotations

import itertools
import logging
import math
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .config import Cifar10DataConfig, ConfigError, DataConfig, ImageFolderDataConfig, SyntheticDataConfig
from .distributed import DistEnv

log = logging.getLogger(__name__)

MASK64 = (1 << 64) - 1
CROP_PADDING = 4

# A training key names one sample of one epoch; weight 0 marks padding that fills a rank's
# share of the last, short global batch (it runs through the model but adds no gradient).
TrainKey = tuple[int, int, float]  # (index, epoch, weight)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A well-mixed 64-bit number from (seed, epoch, index): splitmix64's finaliser."""
    x = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB + 1) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def augment(image: torch.Tensor, seed: int, epoch: int, index: int) -> torch.Tensor:
    """Random crop with zero padding and horizontal flip, drawn from (seed, epoch, index)."""
    draw = sample_seed(seed, epoch, index)
    span = 2 * CROP_PADDING + 1
    dy, dx, flip = draw % span, (draw >> 8) % span, (draw >> 16) & 1
    height, width = image.shape[-2:]
    padded = F.pad(image, (CROP_PADDING,) * 4)
    out = padded[..., dy : dy + height, dx : dx + width]
    return out.flip(-1) if flip else out


def as_int64(value: int) -> int:
    """The int64 with the same 64 bits as the unsigned `value`."""
    return value - (1 << 64) if value >= 1 << 63 else value


def shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 tensors that hold unsigned 64-bit patterns."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def sample_seeds(seed: int, epoch: int, indices: torch.Tensor) -> torch.Tensor:
    """`sample_seed` of many indices at once, on their device: int64 tensors of the same bits."""
    base = as_int64((seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + 1) & MASK64)
    x = indices * as_int64(0x94D049BB133111EB) + base  # int64 arithmetic wraps like uint64's
    x = (x ^ shift_right(x, 30)) * as_int64(0xBF58476D1CE4E5B9)
    x = (x ^ shift_right(x, 27)) * as_int64(0x94D049BB133111EB)
    return x ^ shift_right(x, 31)


def augment_batch(images: torch.Tensor, seed: int, epoch: int, indices: torch.Tensor) -> torch.Tensor:
    """`augment` of every image of a batch at once, on the batch's device: the same crops and flips."""
    draw = sample_seeds(seed, epoch, indices)
    span = 2 * CROP_PADDING + 1
    dy = (shift_right(draw, 32) * (2**32 % span) + (draw & 0xFFFFFFFF)) % span  # the unsigned draw % span
    dx, flip = shift_right(draw, 8) % span, shift_right(draw, 16) & 1
    count, _, height, width = images.shape
    padded = F.pad(images, (CROP_PADDING,) * 4)
    rows = dy[:, None] + torch.arange(height, device=images.device)
    columns = torch.arange(width, device=images.device)
    columns = torch.where(flip[:, None] == 1, width - 1 - columns, columns) + dx[:, None]
    batch = torch.arange(count, device=images.device)[:, None, None]
    return padded[batch, :, rows[:, :, None], columns[:, None, :]].permute(0, 3, 1, 2).contiguous()


def normalise(images_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 pixels to floats of mean about 0 and spread about 1."""
    return (images_uint8.float() / 255.0 - 0.5) / 0.25


class TensorImages(Dataset):
    """Images held in memory as one (N, C, H, W) tensor with integer labels."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index]
        return (normalise(image) if image.dtype == torch.uint8 else image), int(self.labels[index])


def make_synthetic(config: SyntheticDataConfig, seed: int) -> tuple[TensorImages, TensorImages]:
    """A learnable set made from the seed: smooth class prototypes plus per-sample noise."""
    size = config.image_size
    prototypes_rng = torch.Generator().manual_seed(seed)
    coarse = torch.randn(config.num_classes, 3, 4, 4, generator=prototypes_rng)
    prototypes = F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)

    def draw(count: int, stream: int) -> TensorImages:
        rng = torch.Generator().manual_seed(seed * 1000 + stream)
        labels = torch.randint(config.num_classes, (count,), generator=rng)
        noise = torch.randn(count, 3, size, size, generator=rng)
        return TensorImages(prototypes[labels] * 0.2 + noise, labels)

    return draw(config.train_size, 1), draw(config.val_size, 2)


CIFAR_DIR = "cifar-10-batches-py"
CIFAR_TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
CIFAR_TEST_FILES = ["test_batch"]


def read_cifar_batches(folder: Path, names: Sequence[str]) -> TensorImages:
    """CIFAR-10's python format: pickled dicts of uint8 rows (3x32x32) and labels."""
    images, labels = [], []
    for name in names:
        with open(folder / name, "rb") as file:
            batch = pickle.load(file, encoding="latin1")  # the data set's own format
        images.append(torch.as_tensor(batch["data"], dtype=torch.uint8).reshape(-1, 3, 32, 32))
        labels.append(torch.as_tensor(batch["labels"], dtype=torch.long))
    return TensorImages(torch.cat(images), torch.cat(labels))


def check_data_available(config: DataConfig) -> None:
    """Refuse, before any work, a data set whose files are not where the config says."""
    if isinstance(config, Cifar10DataConfig):
        folder = Path(config.root) / CIFAR_DIR
        missing = [name for name in CIFAR_TRAIN_FILES + CIFAR_TEST_FILES if not (folder / name).is_file()]
        if missing and not config.download:
            raise ConfigError(
                f"CIFAR-10 not found: {folder} lacks {', '.join(missing)}; put the python-version files "
                f"there or set data.download=true"
            )
        require_image_size(config, 32)
    if isinstance(config, ImageFolderDataConfig):
        for split in ("train", "val"):
            if not (Path(config.root) / split).is_dir():
                raise ConfigError(
                    f"image_folder: {Path(config.root) / split} does not exist; "
                    "set data.root to a folder with train/ and val/"
                )


def make_cifar10(config: Cifar10DataConfig) -> tuple[TensorImages, TensorImages]:
    folder = Path(config.root) / CIFAR_DIR
    check_data_available(config)
    if config.download and not all((folder / name).is_file() for name in CIFAR_TRAIN_FILES + CIFAR_TEST_FILES):
        from torchvision.datasets import CIFAR10

        CIFAR10(config.root, train=True, download=True)
    return read_cifar_batches(folder, CIFAR_TRAIN_FILES), read_cifar_batches(folder, CIFAR_TEST_FILES)


def require_image_size(config: DataConfig, size: int) -> None:
    if config.image_size != size:
        raise ConfigError(f"data.image_size={config.image_size} but {config.name} images are {size}x{size}")


def make_image_folder(config: ImageFolderDataConfig) -> tuple[Dataset, Dataset]:
    from torchvision import datasets, transforms

    check_data_available(config)
    transform = transforms.Compose(
        [transforms.Resize((config.image_size, config.image_size)), transforms.PILToTensor(), normalise]
    )
    train, val = (
        datasets.ImageFolder(str(Path(config.root) / split), transform=transform) for split in ("train", "val")
    )
    if train.classes != val.classes or len(train.classes) != config.num_classes:
        raise ConfigError(
            f"image_folder: train/ has {len(train.classes)} classes, val/ has {len(val.classes)}, "
            f"data.num_classes={config.num_classes}: make them agree"
        )
    return train, val


def make_datasets(config: DataConfig, seed: int) -> tuple[Dataset, Dataset]:
    """The (train, val) pair of the configured data set, items (image tensor, label)."""
    if isinstance(config, SyntheticDataConfig):
        return make_synthetic(config, seed)
    if isinstance(config, Cifar10DataConfig):
        return make_cifar10(config)
    if isinstance(config, ImageFolderDataConfig):
        return make_image_folder(config)
    raise ConfigError(f"data.name={config.name!r} has no loader")


class KeyedDataset(Dataset):
    """Items (image, label, weight, index); training keys are (index, epoch, weight), evaluation keys indices."""

    def __init__(self, base: Dataset, seed: int, augmented: bool) -> None:
        self.base, self.seed, self.augmented = base, seed, augmented

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, key: int | TrainKey) -> tuple[torch.Tensor, int, float, int]:
        if isinstance(key, int):
            image, label = self.base[key]
            return image, label, 1.0, key
        index, epoch, weight = key
        image, label = self.base[index]
        if self.augmented:
            image = augment(image, self.seed, epoch, index)
        return image, label, weight, index


class ResumableDistributedSampler(DistributedSampler):
    """DistributedSampler whose order ignores the world size and that can start mid-epoch.

    Each epoch's order is a permutation drawn from (seed, epoch) alone. Global batches of
    world_size * batch_size consecutive samples of that order are split among the ranks; the
    last, short one is split as evenly as possible, and a rank left with nothing gets one
    padding key of weight 0. So no sample is dropped or repeated, whatever the world size,
    and `set_start(n)` resumes after the first n samples of the epoch, also on another world
    size. Call `set_epoch(epoch)` before every epoch, as with DistributedSampler.
    """

    def __init__(self, dataset_size: int, env: DistEnv, batch_size: int, seed: int, shuffle: bool = True) -> None:
        super().__init__(range(dataset_size), num_replicas=env.world_size, rank=env.rank, shuffle=shuffle, seed=seed)
        self.dataset_size = dataset_size
        self.batch_size = batch_size
        self.start = 0

    @property
    def global_batch_size(self) -> int:
        return self.num_replicas * self.batch_size

    def set_start(self, samples_done: int) -> None:
        """Skip the first `samples_done` samples of the epoch's order (those already trained on)."""
        self.start = samples_done

    def epoch_order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.dataset_size)
        return torch.randperm(self.dataset_size, generator=torch.Generator().manual_seed(self.seed + self.epoch))

    def steps_left(self) -> int:
        return math.ceil((self.dataset_size - self.start) / self.global_batch_size)

    def real_samples_in_step(self, samples_done: int, global_batches: int = 1) -> int:
        """How many real (non-padding) samples the next `global_batches` global batches hold."""
        return min(global_batches * self.global_batch_size, self.dataset_size - samples_done)

    def rank_slice(self, chunk_size: int) -> tuple[int, int]:
        """(offset, length) of this rank's share of a global batch of chunk_size samples."""
        if chunk_size == self.global_batch_size:
            return self.rank * self.batch_size, self.batch_size
        base, extra = divmod(chunk_size, self.num_replicas)
        return self.rank * base + min(self.rank, extra), base + (1 if self.rank < extra else 0)

    def __iter__(self) -> Iterator[TrainKey]:  # type: ignore[override]
        order = self.epoch_order()[self.start :].tolist()
        for begin in range(0, len(order), self.global_batch_size):
            chunk = order[begin : begin + self.global_batch_size]
            offset, length = self.rank_slice(len(chunk))
            if length == 0:
                yield chunk[0], self.epoch, 0.0
            for index in chunk[offset : offset + length]:
                yield index, self.epoch, 1.0

    def __len__(self) -> int:
        remaining = self.dataset_size - self.start
        full, last = divmod(remaining, self.global_batch_size)
        return full * self.batch_size + (max(1, self.rank_slice(last)[1]) if last else 0)


class DeviceBatches:
    """The training batches of `data.on_device`: the set lives on the device and each batch is
    gathered, normalised and augmented there, from the sampler's own keys, so the batches equal
    the DataLoader's (same order, same crops and flips) without workers or host-to-device copies."""

    def __init__(
        self, base: TensorImages, sampler: ResumableDistributedSampler, seed: int, augmented: bool, device: torch.device
    ) -> None:
        self.images, self.labels = base.images.to(device), base.labels.to(device)
        self.sampler, self.seed, self.augmented, self.device = sampler, seed, augmented, device

    def __len__(self) -> int:
        return math.ceil(len(self.sampler) / self.sampler.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        keys = iter(self.sampler)
        while chunk := list(itertools.islice(keys, self.sampler.batch_size)):
            indices = torch.tensor([index for index, _, _ in chunk])
            weights = torch.tensor([weight for _, _, weight in chunk], dtype=torch.float64)  # as collated
            on_device = indices.to(self.device, non_blocking=True)
            images = self.images[on_device]
            if images.dtype == torch.uint8:
                images = normalise(images)
            if self.augmented:
                images = augment_batch(images, self.seed, self.sampler.epoch, on_device)
            yield images, self.labels[on_device], weights, indices


def eval_shard(size: int, rank: int, world_size: int) -> range:
    """This rank's contiguous share of the evaluation set: no padding, no sample twice."""
    return range(size * rank // world_size, size * (rank + 1) // world_size)


@dataclass
class Data:
    train_loader: DataLoader | DeviceBatches
    val_loader: DataLoader
    sampler: ResumableDistributedSampler
    val_size: int


def loader_options(config: DataConfig, env: DistEnv) -> dict:
    workers = config.num_workers
    return {
        "batch_size": config.batch_size,
        "num_workers": workers,
        "pin_memory": env.device.type == "cuda",
        "persistent_workers": workers > 0,
        "prefetch_factor": 4 if workers > 0 else None,
    }


def build_data(config: DataConfig, env: DistEnv, seed: int) -> Data:
    """The training loader (resumable distributed sampler) and this rank's evaluation loader."""
    train_base, val_base = make_datasets(config, seed)
    train_set = KeyedDataset(train_base, seed, augmented=config.augment)
    val_set = KeyedDataset(val_base, seed, augmented=False)
    sampler = ResumableDistributedSampler(len(train_set), env, config.batch_size, seed)
    options = loader_options(config, env)
    shard = torch.utils.data.Subset(val_set, list(eval_shard(len(val_set), env.rank, env.world_size)))
    if config.on_device:  # config.check() allows it for in-memory sets (TensorImages) only
        train_loader: DataLoader | DeviceBatches = DeviceBatches(train_base, sampler, seed, config.augment, env.device)
    else:
        train_loader = DataLoader(train_set, sampler=sampler, **options)
    return Data(
        train_loader=train_loader,
        val_loader=DataLoader(shard, shuffle=False, **options),
        sampler=sampler,
        val_size=len(val_set),
    )

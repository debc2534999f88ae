"""The data path: keyed samples, the training sampler, loaders and the exact evaluation split.

Determinism is the contract here: an epoch's sample order is a function of (seed, epoch),
a sample's augmentation a function of (seed, epoch, index). Neither depends on the number of
processes or DataLoader workers, which is what lets a run resume bit-exactly, also on another
world size, and lets evaluation give the same figures at any world size.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .components import build_datasets
from .config import ConfigError, DataConfig, JobError, first_line
from .datasets import TensorImages, normalise
from .distributed import DistEnv
from .randomness import EVAL_EPOCH, MASK64, building_sample, sample_seed

log = logging.getLogger(__name__)

CROP_PADDING = 4

# A training key names one sample of one epoch; weight 0 marks padding that fills a rank's
# share of the last, short global batch (it runs through the model but adds no gradient).
TrainKey = tuple[int, int, float]  # (index, epoch, weight)


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


def describe_item(dataset: Dataset, index: int) -> str:
    """The file behind an item, where the data set says (torchvision's folder sets do)."""
    samples = getattr(dataset, "samples", None)
    try:
        return f" ({samples[index][0]})" if samples is not None else ""
    except (IndexError, TypeError, KeyError):
        return ""


class KeyedDataset(Dataset):
    """Items (input, target, weight, index); training keys are (index, epoch, weight), evaluation
    keys indices. While the base set builds a sample, its (seed, epoch, index) is the current
    sample's key (randomness.py), which the sample's own random draws come from."""

    def __init__(self, base: Dataset, seed: int, augmented: bool) -> None:
        self.base, self.seed, self.augmented = base, seed, augmented

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, key: int | TrainKey) -> tuple[Any, Any, float, int]:
        index, epoch, weight = (key, EVAL_EPOCH, 1.0) if isinstance(key, int) else key
        with building_sample(self.seed, epoch, index):
            try:
                item = self.base[index]
            except Exception as error:  # a corrupt file met mid-epoch: no restart can fix it
                raise JobError(f"data set item {index}{describe_item(self.base, index)} failed to load "
                               f"({first_line(error)}): fix or remove it, then launch again") from error  # fmt: skip
        if not (isinstance(item, tuple | list) and len(item) == 2):
            raise TypeError(f"data set items must be (input, target) pairs; item {index} is a {type(item).__name__}")
        inputs, target = item
        if self.augmented and epoch != EVAL_EPOCH:
            inputs = augment(inputs, self.seed, epoch, index)
        return inputs, target, weight, index


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


def loader_options(config: DataConfig, env: DistEnv, seed: int) -> dict:
    workers = config.num_workers
    return {
        "batch_size": config.batch_size,
        "num_workers": workers,
        "pin_memory": env.device.type == "cuda",
        "persistent_workers": workers > 0,
        "prefetch_factor": 4 if workers > 0 else None,
        # A generator of its own: a loader would otherwise draw its workers' base seed from the
        # global one at every epoch's start, shifting the dropout masks of a resumed run.
        "generator": torch.Generator().manual_seed(seed),
    }


def check_datasets(config: DataConfig, pair: tuple[Dataset, Dataset]) -> None:
    """Refuse, before any work, what the loader settings cannot do with these sets."""
    if config.on_device and not isinstance(pair[0], TensorImages):
        raise ConfigError(
            f"data.on_device=true needs a data set held in memory (a TensorImages, as synthetic and cifar10 "
            f"give), not a {type(pair[0]).__name__}: set data.on_device=false"
        )


def build_data(config: DataConfig, env: DistEnv, seed: int) -> Data:
    """The training loader (resumable distributed sampler) and this rank's evaluation loader."""
    train_base, val_base = build_datasets(config.dataset)
    check_datasets(config, (train_base, val_base))
    train_set = KeyedDataset(train_base, seed, augmented=config.augment)
    val_set = KeyedDataset(val_base, seed, augmented=False)
    sampler = ResumableDistributedSampler(len(train_set), env, config.batch_size, seed)
    options = loader_options(config, env, seed)
    shard = torch.utils.data.Subset(val_set, list(eval_shard(len(val_set), env.rank, env.world_size)))
    if config.on_device:  # check_datasets allows it for in-memory sets (TensorImages) only
        in_memory: TensorImages = train_base  # type: ignore[assignment]
        train_loader: DataLoader | DeviceBatches = DeviceBatches(in_memory, sampler, seed, config.augment, env.device)
    else:
        train_loader = DataLoader(train_set, sampler=sampler, **options)
    return Data(
        train_loader=train_loader,
        val_loader=DataLoader(shard, shuffle=False, **options),
        sampler=sampler,
        val_size=len(val_set),
    )

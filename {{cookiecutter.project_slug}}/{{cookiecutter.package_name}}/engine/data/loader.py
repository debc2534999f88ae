"""The data path: keyed samples and the loaders, for training (DataLoader or on the device) and evaluation.
Every sample is built from its key (seed, epoch, index), which its random draws come from: the batches do not
depend on the number of processes or workers. `data.collate`: docs/configuration.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from ...augment import augment, augment_batch
from ...common.errors import ConfigError, JobError, first_line
from ...common.placement import DistEnv
from ...common.processes import data_worker_start
from ...config import DataConfig
from ...config.targets import build, describe, is_map_style
from ...datasets.collate import Batch
from ...datasets.images import DeviceBatches, TensorImages
from ...datasets.randomness import EVAL_EPOCH, building_sample
from .sampler import ResumableDistributedSampler, TrainKey, eval_shard


def describe_item(dataset: Dataset, index: int) -> str:
    """The file behind an item, where the data set says (torchvision's folder sets do)."""
    samples = getattr(dataset, "samples", None)
    try:
        return f" ({samples[index][0]})" if samples is not None else ""
    except (IndexError, TypeError, KeyError):
        return ""


class KeyedDataset(Dataset):
    """Items (input, target, weight, index) of training keys (index, epoch, weight) or evaluation keys (indices),
    each built under its key (datasets/randomness.py). `transform(input, seed, epoch, index)`: training's only."""

    def __init__(self, base: Dataset, seed: int, transform: Callable[[Any, int, int, int], Any] | None = None) -> None:
        self.base, self.seed, self.transform = base, seed, transform

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, key: int | TrainKey) -> Batch:
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
        if self.transform is not None and epoch != EVAL_EPOCH:
            inputs = self.transform(inputs, self.seed, epoch, index)
        return Batch(inputs, target, weight, index)  # type: ignore[arg-type]  # numbers, collated into tensors


class KeyedCollate:
    """The batches of keyed items with the user's `data.collate` (a function of a list of (input, target) items
    that returns (inputs, targets)); the weights and indices are batched here."""

    def __init__(self, node: Mapping[str, Any]) -> None:
        self.target = node["_target_"]
        self.collate = build({**node, "_partial_": True}, "data.collate")  # the function, its keys bound

    def __call__(self, items: list[Batch]) -> Batch:
        inputs, targets = self.pairs([(inputs, target) for inputs, target, _, _ in items])
        weights = torch.tensor([weight for _, _, weight, _ in items], dtype=torch.float64)
        indices = torch.tensor([index for _, _, _, index in items], dtype=torch.int64)
        return Batch(inputs, targets, weights, indices)

    def pairs(self, items: list[tuple[Any, Any]]) -> tuple[Any, Any]:
        """The user's (inputs, targets) of a list of (input, target) items; a failure is one line."""
        try:
            batch = self.collate(items)
        except Exception as error:
            raise JobError(
                f"data.collate._target_={self.target} failed on a batch of {len(items)} items ({first_line(error)}): "
                "it is called with a list of (input, target) items and returns (inputs, targets)"
            ) from error
        if not (isinstance(batch, tuple | list) and len(batch) == 2):
            raise JobError(f"data.collate._target_={self.target} returned {describe(batch)}, not (inputs, targets)")
        return batch[0], batch[1]


def build_collate(config: DataConfig) -> KeyedCollate | None:
    """The user's `data.collate` over keyed items; None without one (torch's default_collate)."""
    return KeyedCollate(config.collate) if config.collate is not None else None


@dataclass
class Data:
    train_loader: DataLoader | DeviceBatches
    val_loader: DataLoader
    sampler: ResumableDistributedSampler
    val_size: int
    prepared: dict[str, str] | None = None  # the training set's prepared data ({"root", "id"}): tokens, shards
    val_sets: dict[str, DataLoader] = field(default_factory=dict)  # data.val_sets: this rank's share of each, by name
    test_loader: DataLoader | None = None  # data.test_set: this rank's share, evaluated once at the end of training


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
        "collate_fn": build_collate(config),
        "worker_init_fn": data_worker_start if workers > 0 else None,
    }


def build_datasets(node: Mapping[str, Any]) -> tuple[Dataset, Dataset]:
    """The (train, val) pair of map-style data sets that `data.dataset._target_` returns."""
    pair = build(node, "data.dataset")
    if not (isinstance(pair, tuple | list) and len(pair) == 2 and all(is_map_style(item) for item in pair)):
        raise ConfigError(
            f"data.dataset._target_={node['_target_']} returned {describe(pair)}, not a pair "
            "(train, val) of map-style data sets (objects with __len__ and __getitem__)"
        )
    for name, dataset in zip(("train", "val"), pair, strict=True):
        if len(dataset) == 0:
            raise ConfigError(f"data.dataset._target_={node['_target_']}: the {name} set is empty")
    return pair[0], pair[1]


def check_datasets(config: DataConfig, pair: tuple[Dataset, Dataset]) -> None:
    """Refuse, before any work, what the loader settings cannot do with these sets."""
    if config.on_device and config.collate is not None:
        raise ConfigError(
            "data.on_device=true gathers batches on the device from a set of stacked tensors, which "
            "data.collate does not batch: set data.on_device=false or drop data.collate"
        )
    if config.on_device and not isinstance(pair[0], TensorImages):
        raise ConfigError(
            f"data.on_device=true needs a data set held in memory (a TensorImages, as synthetic and cifar10 "
            f"give), not a {type(pair[0]).__name__}: set data.on_device=false"
        )


def build_data(config: DataConfig, env: DistEnv, seed: int) -> Data:
    """The training loader (resumable distributed sampler) and this rank's evaluation loader."""
    train_base, val_base = build_datasets(config.dataset)
    check_datasets(config, (train_base, val_base))
    val_sets, test_set = build_eval_sets(config)
    train_set = KeyedDataset(train_base, seed, augment if config.augment else None)
    val_set = KeyedDataset(val_base, seed)
    sampler = ResumableDistributedSampler.for_dataset(train_base, env, config.batch_size, seed)
    options = loader_options(config, env, seed)
    shard = torch.utils.data.Subset(val_set, list(eval_shard(len(val_set), env.rank, env.world_size)))
    if config.on_device:  # check_datasets allows it for in-memory sets (TensorImages) only
        in_memory: TensorImages = train_base  # type: ignore[assignment]
        batch_transform = augment_batch if config.augment else None
        train_loader: DataLoader | DeviceBatches = DeviceBatches(in_memory, sampler, seed, batch_transform, env.device)
    else:
        train_loader = DataLoader(train_set, sampler=sampler, **options)
    return Data(
        train_loader=train_loader,
        val_loader=DataLoader(shard, shuffle=False, **options),
        sampler=sampler,
        val_size=len(val_set),
        prepared=getattr(train_base, "prepared", None),
        val_sets={name: eval_loader(dataset, config, env, seed) for name, dataset in val_sets.items()},
        test_loader=eval_loader(test_set, config, env, seed) if test_set is not None else None,
    )


def eval_loader(dataset: Dataset, config: DataConfig, env: DistEnv, seed: int) -> DataLoader:
    """This rank's unpadded share of an evaluation set, loaded as the validation set is. A generator of its own:
    the training loader's draws stay those of a run without it."""
    keyed = KeyedDataset(dataset, seed)
    shard = torch.utils.data.Subset(keyed, list(eval_shard(len(keyed), env.rank, env.world_size)))
    return DataLoader(shard, shuffle=False, **loader_options(config, env, seed))


def build_eval_sets(config: DataConfig) -> tuple[dict[str, Dataset], Dataset | None]:
    """data.val_sets (name -> node) and data.test_set (a node or null), built; refused in one line where wrong."""
    if not isinstance(config.val_sets, Mapping):
        raise ConfigError(f"data.val_sets must map names to data set nodes (data.val_sets.hard._target_=...), not "
                          f"{describe(config.val_sets)}")  # fmt: skip
    sets = {}
    for name, node in config.val_sets.items():
        if not re.fullmatch(r"[A-Za-z0-9]+(_[A-Za-z0-9]+)*", str(name)):  # it names figures: val_<name>_<metric>
            raise ConfigError(f"data.val_sets.{name}: a name of letters, digits and single underscores, please "
                              "(the figures are val_<name>_<metric>)")  # fmt: skip
        sets[str(name)] = eval_set(node, f"data.val_sets.{name}")
    return sets, (eval_set(config.test_set, "data.test_set") if config.test_set is not None else None)


def eval_set(node: Any, key: str) -> Dataset:
    """The map-style data set a node's `_target_` returns; of a (train, val) pair, its val set."""
    if not (isinstance(node, Mapping) and "_target_" in node):
        raise ConfigError(f"{key} must be a node with a _target_ that returns a map-style data set, not "
                          f"{describe(node)}")  # fmt: skip
    built = build(node, key)
    if isinstance(built, tuple) and len(built) == 2 and all(is_split(item) for item in built):
        built = built[1]
    if not is_map_style(built) or len(built) == 0:
        raise ConfigError(f"{key}._target_={node['_target_']} returned {describe(built)}: it must return a "
                          "non-empty map-style data set (or a (train, val) pair, whose val set is taken)")  # fmt: skip
    return built


def is_split(item: Any) -> bool:
    """A data set of a (train, val) pair, not an (input, target) item of a two-item set."""
    return is_map_style(item) and not isinstance(item, tuple | list | torch.Tensor)

"""data.py: keyed samples and the loaders; the batches are a function of (seed, epoch, index)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.components import build_datasets
from {{cookiecutter.package_name}}.engine.data import DeviceBatches, KeyedDataset, build_data
from {{cookiecutter.package_name}}.engine.sampler import ResumableDistributedSampler
from {{cookiecutter.package_name}}.errors import ConfigError
from {{cookiecutter.package_name}}.randomness import seeded_by_sample

from ..helpers import compose_config, cpu_env, write_cifar, write_image_tree


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_do_not_depend_on_the_number_of_workers(workers: int) -> None:
    config = to_train_config(compose_config(["data=synthetic", "data.train_size=96", "data.augment=true"]))
    base, _ = build_datasets(config.data.dataset)
    sampler = ResumableDistributedSampler(len(base), cpu_env(0, 1), 16, seed=0)
    sampler.set_epoch(1)
    dataset = KeyedDataset(base, seed=0, augmented=True)
    reference = torch.cat([batch[0] for batch in DataLoader(dataset, sampler=sampler, batch_size=16)])
    loaded = torch.cat([batch[0] for batch in DataLoader(dataset, sampler=sampler, batch_size=16, num_workers=workers)])
    assert torch.equal(reference, loaded)


@pytest.mark.parametrize(("name", "rank", "start"), [("synthetic", 0, 0), ("synthetic", 1, 40), ("cifar10", 1, 0)])
def test_on_device_batches_equal_the_loader_batches(tmp_path, name: str, rank: int, start: int) -> None:
    """data.on_device gives the same batches as the DataLoader path (here the device is the CPU)."""
    write_cifar(tmp_path, per_file=20)  # 100 training images, uint8 as CIFAR-10 stores them
    where = f"data.root={tmp_path}" if name == "cifar10" else "data.train_size=100"
    config = to_train_config(compose_config([f"data={name}", where, "data.augment=true"]))
    base, _ = build_datasets(config.data.dataset)
    sampler = ResumableDistributedSampler(len(base), cpu_env(rank, 2), 16, seed=0)
    sampler.set_epoch(3)
    sampler.set_start(start)
    loader = DataLoader(KeyedDataset(base, seed=0, augmented=True), sampler=sampler, batch_size=16)
    expected = list(loader)
    batches = list(DeviceBatches(base, sampler, seed=0, augmented=True, device=torch.device("cpu")))
    assert len(batches) == len(expected) > 1
    for got, want in zip(batches, expected, strict=True):
        for got_part, want_part in zip(got, want, strict=True):
            assert got_part.dtype == want_part.dtype and torch.equal(got_part, want_part)


def test_on_device_needs_a_set_held_in_memory(tmp_path) -> None:
    write_image_tree(tmp_path, classes=10, per_class=1)
    config = to_train_config(compose_config(["data=image_folder", f"data.root={tmp_path}", "data.on_device=true"]))
    with pytest.raises(ConfigError, match="data.on_device=true needs a data set held in memory"):
        build_data(config.data, cpu_env(0, 1), seed=0)


class RandomNoise(torch.utils.data.Dataset):
    """A user's data set with a random transform of its own (torchvision's draw the same way)."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int):
        with seeded_by_sample():
            noise = torch.rand(3) + random.random() + np.random.rand()
        return noise, index


@pytest.mark.parametrize("workers", [0, 2])
def test_a_users_random_transform_is_a_function_of_seed_epoch_and_index(workers: int) -> None:
    dataset = KeyedDataset(RandomNoise(), seed=5, augmented=False)

    def by_index(world_size: int, epoch: int, num_workers: int) -> dict[int, torch.Tensor]:
        seen = {}
        for rank in range(world_size):
            sampler = ResumableDistributedSampler(len(dataset), cpu_env(rank, world_size), 4, seed=5)
            sampler.set_epoch(epoch)
            # The project's loaders have generators of their own (a plain one draws from the global).
            loader = DataLoader(dataset, sampler=sampler, batch_size=4, num_workers=num_workers,
                                generator=torch.Generator())  # fmt: skip
            for noise, target, _, _ in loader:
                seen.update(zip(target.tolist(), noise, strict=True))
        return seen

    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    one = by_index(1, epoch=2, num_workers=0)
    assert torch.equal(torch.rand(1), expected_next), "the global generator is put back after each sample"
    three = by_index(3, epoch=2, num_workers=workers)
    assert one.keys() == three.keys() == set(range(40))
    assert all(torch.equal(one[i], three[i]) for i in one), "same draws at any world size and worker count"
    assert not torch.equal(one[0], by_index(1, epoch=3, num_workers=0)[0]), "another epoch, other draws"
    assert len({tuple(t.tolist()) for t in one.values()}) == 40, "each sample its own draws"

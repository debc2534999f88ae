"""data.py: keyed samples and the loaders; the batches are a function of (seed, epoch, index)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from {{cookiecutter.package_name}}.augment import augment, augment_batch
from {{cookiecutter.package_name}}.common.errors import ConfigError, JobError
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.datasets import pad_sequences
from {{cookiecutter.package_name}}.datasets.images import DeviceBatches
from {{cookiecutter.package_name}}.datasets.randomness import seeded_by_sample
from {{cookiecutter.package_name}}.engine.assembly.components import build_datasets
from {{cookiecutter.package_name}}.engine.data.loader import KeyedDataset, build_data
from {{cookiecutter.package_name}}.engine.data.sampler import ResumableDistributedSampler, eval_shard

from ...helpers import compose_config, cpu_env, sequence_data, write_cifar, write_image_tree


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_do_not_depend_on_the_number_of_workers(workers: int) -> None:
    config = to_train_config(compose_config(["data=synthetic", "data.train_size=96", "data.augment=true"]))
    base, _ = build_datasets(config.data.dataset)
    sampler = ResumableDistributedSampler(len(base), cpu_env(0, 1), 16, seed=0)
    sampler.set_epoch(1)
    dataset = KeyedDataset(base, seed=0, transform=augment)
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
    loader = DataLoader(KeyedDataset(base, seed=0, transform=augment), sampler=sampler, batch_size=16)
    expected = list(loader)
    batches = list(DeviceBatches(base, sampler, seed=0, transform=augment_batch, device=torch.device("cpu")))
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
    dataset = KeyedDataset(RandomNoise(), seed=5)

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


def pad_and_show_the_items(items: list, pad_value: int) -> tuple[dict, torch.Tensor]:
    """A user's data.collate: pad_sequences' batch as a dict, with the size of each item it was given."""
    (padded, lengths), targets = pad_sequences(items, pad_value=pad_value)
    return {"padded": padded, "lengths": lengths, "item_sizes": torch.tensor([len(item) for item in items])}, targets


def fails(items: list) -> tuple[torch.Tensor, torch.Tensor]:
    raise ValueError(f"no batch of {len(items)} here")


def test_a_users_collate_batches_the_items_and_the_project_their_weights_and_indices() -> None:
    """9 training items on rank 1 of 2, batches of 4: 4 items, then a padding key of weight 0 (the last
    global batch holds one sample, rank 0's). The collate sees (input, target) pairs only."""
    collate = {"_target_": f"{__name__}.pad_and_show_the_items", "pad_value": 63}
    data = build_data(sequence_data(collate=collate), cpu_env(1, 2), seed=0)
    data.sampler.set_epoch(0)
    keys = list(data.sampler)
    seen: list[tuple[int, int, float]] = []
    for loader in (data.train_loader, data.val_loader):
        for inputs, targets, weights, indices in loader:
            assert inputs["item_sizes"].eq(2).all(), "the user's collate sees (input, target) pairs only"
            assert weights.dtype == torch.float64 and indices.dtype == torch.int64, "as default_collate makes them"
            first = 50 if loader is data.val_loader else 0  # where the val set's tokens start
            for row, index, length in zip(inputs["padded"], indices.tolist(), inputs["lengths"].tolist(), strict=True):
                start = first + index
                assert length == index % 4 + 1 and row[:length].tolist() == list(range(start, start + length))
                assert row[length:].eq(63).all(), "padded with data.collate.pad_value"
            assert targets.tolist() == [(first + index) % 3 for index in indices.tolist()]
            seen += [(index, 0, weight) for index, weight in zip(indices.tolist(), weights.tolist(), strict=True)]
    assert seen[: len(keys)] == keys and keys[-1][2] == 0.0, "the sampler's keys, its padding key included"
    assert [index for index, _, _ in seen[len(keys) :]] == list(eval_shard(5, 1, 2)), "this rank's evaluation shard"


def test_a_collate_that_fails_mid_run_says_so_in_one_line_naming_data_collate() -> None:
    data = build_data(sequence_data(collate={"_target_": f"{__name__}.fails"}), cpu_env(0, 1), seed=0)
    with pytest.raises(JobError) as error:
        next(iter(data.val_loader))
    assert str(error.value) == (
        f"data.collate._target_={__name__}.fails failed on a batch of 4 items (ValueError: no batch of 4 here): "
        "it is called with a list of (input, target) items and returns (inputs, targets)"
    )
    returns_the_items = build_data(sequence_data(collate={"_target_": "builtins.list"}), cpu_env(0, 1), seed=0)
    returns_the_items.sampler.set_epoch(0)
    with pytest.raises(
        JobError, match=r"^data.collate._target_=builtins.list returned a list of 4, not \(inputs, targets\)$"
    ):
        next(iter(returns_the_items.train_loader))


def test_a_collate_that_cannot_work_is_refused_before_any_work() -> None:
    with pytest.raises(ConfigError, match=r"^data.collate._target_=nowhere.pad does not import"):
        build_data(sequence_data(collate={"_target_": "nowhere.pad"}), cpu_env(0, 1), seed=0)
    with pytest.raises(ConfigError, match=r"^data.on_device=true gathers batches .* drop data.collate$"):
        build_data(sequence_data(on_device=True), cpu_env(0, 1), seed=0)

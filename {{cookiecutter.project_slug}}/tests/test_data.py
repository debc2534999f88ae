"""Keyed samples, the loaders and the data sets: the batches are a function of (seed, epoch, index)."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from {{cookiecutter.package_name}}.components import build_datasets
from {{cookiecutter.package_name}}.config import ConfigError, to_train_config
from {{cookiecutter.package_name}}.data import DeviceBatches, KeyedDataset, build_data
from {{cookiecutter.package_name}}.distributed import DistEnv
from {{cookiecutter.package_name}}.randomness import seeded_by_sample
from {{cookiecutter.package_name}}.sampler import ResumableDistributedSampler

from .conftest import compose_config, run


def env(rank: int, world_size: int) -> DistEnv:
    return DistEnv(rank, rank, world_size, world_size, "gloo", torch.device("cpu"))


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_do_not_depend_on_the_number_of_workers(workers: int) -> None:
    config = to_train_config(compose_config(["data=synthetic", "data.train_size=96", "data.augment=true"]))
    base, _ = build_datasets(config.data.dataset)
    sampler = ResumableDistributedSampler(len(base), env(0, 1), 16, seed=0)
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
    sampler = ResumableDistributedSampler(len(base), env(rank, 2), 16, seed=0)
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
        build_data(config.data, env(0, 1), seed=0)


def test_synthetic_set_is_made_from_the_seed() -> None:
    def made(seed: int):
        overrides = ["data=synthetic", "data.train_size=50", "data.val_size=20", f"seed={seed}"]
        return build_datasets(to_train_config(compose_config(overrides)).data.dataset)

    (a, _), (b, _), (c, _) = made(0), made(0), made(1)
    assert torch.equal(a.images, b.images) and not torch.equal(a.images, c.images)
    assert len(set(a.labels.tolist())) > 2


def write_image_tree(root, classes: int, per_class: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label in range(classes):
            folder = root / split / f"class_{label}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")


def test_image_folder_reads_a_local_tree(tmp_path) -> None:
    write_image_tree(tmp_path, classes=3, per_class=4)
    overrides = [
        "data=image_folder",
        f"data.root={tmp_path}",
        "data.num_classes=3",
        "data.image_size=16",
        "data.num_workers=0",
    ]
    config = to_train_config(compose_config(overrides))
    data = build_data(config.data, env(0, 1), seed=0)
    images, labels, weights, indices = next(iter(data.train_loader))
    assert images.shape[1:] == (3, 16, 16) and set(labels.tolist()) <= {0, 1, 2}
    assert data.val_size == 12 and weights.tolist() == [1.0] * len(indices)


def test_image_folder_class_count_mismatch_is_a_clear_error(tmp_path) -> None:
    write_image_tree(tmp_path, classes=3, per_class=1)
    config = to_train_config(compose_config(["data=image_folder", f"data.root={tmp_path}"]))
    with pytest.raises(ConfigError, match="data.num_classes=10"):
        build_datasets(config.data.dataset)


def write_cifar(root, per_file: int) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            "data": rng.integers(0, 255, (per_file, 3072), dtype=np.uint8),
            "labels": [int(label) for label in rng.integers(0, 10, per_file)],
        }
        with open(folder / name, "wb") as file:
            pickle.dump(batch, file)


def test_cifar10_reads_its_own_format(tmp_path) -> None:
    write_cifar(tmp_path, per_file=6)
    config = to_train_config(compose_config(["data=cifar10", f"data.root={tmp_path}"]))
    train, val = build_datasets(config.data.dataset)
    assert (len(train), len(val)) == (30, 6)
    image, label = train[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and 0 <= label < 10


def test_cifar10_missing_says_where_and_does_not_download(tmp_path) -> None:
    config = to_train_config(compose_config(["data=cifar10", f"data.root={tmp_path}"]))
    with pytest.raises(ConfigError, match="cifar-10-batches-py.*data.download=true"):
        build_datasets(config.data.dataset)
    assert not any(tmp_path.iterdir()), "nothing may be downloaded unless asked"


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
            sampler = ResumableDistributedSampler(len(dataset), env(rank, world_size), 4, seed=5)
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


@pytest.mark.parametrize("fault", ["empty class folder", "empty file", "class count"])
def test_an_image_tree_that_would_fail_mid_epoch_is_refused_naming_the_folder_or_file(tmp_path, fault: str) -> None:
    write_image_tree(tmp_path, classes=3, per_class=2)
    if fault == "empty class folder":
        (tmp_path / "val" / "class_4").mkdir()
        (tmp_path / "train" / "class_4").mkdir()
        for image in (tmp_path / "val" / "class_4").glob("*"):
            image.unlink()
        (tmp_path / "train" / "class_4" / "1.png").write_bytes((tmp_path / "train" / "class_0" / "0.png").read_bytes())
        expected, classes = f"{tmp_path / 'val' / 'class_4'} holds no images", 4
    elif fault == "empty file":
        (tmp_path / "train" / "class_1" / "0.png").write_bytes(b"")
        expected, classes = f"{tmp_path / 'train' / 'class_1' / '0.png'} is an empty file", 3
    else:
        expected, classes = f"{tmp_path / 'train'} has 3 class folders, data.num_classes=5", 5
    overrides = ["data=image_folder", f"data.root={tmp_path}", f"data.num_classes={classes}"]
    config = to_train_config(compose_config(overrides))
    with pytest.raises(ConfigError) as error:
        build_datasets(config.data.dataset)
    assert expected in str(error.value) and "\n" not in str(error.value)


@pytest.mark.slow
def test_a_truncated_jpeg_met_mid_epoch_stops_the_job_once_naming_the_file(tmp_path) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label in range(2):
            folder = tmp_path / "images" / split / f"class_{label}"
            folder.mkdir(parents=True)
            for i in range(8):
                pixels = rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=95)
    broken = tmp_path / "images" / "train" / "class_0" / "3.jpg"  # neither the first nor the last item
    broken.write_bytes(broken.read_bytes()[:300])
    run_dir = tmp_path / "run"
    data = ["data=image_folder", f"data.root={tmp_path / 'images'}", "data.num_classes=2", "data.image_size=16",
            "data.num_workers=1", "data.batch_size=4"]  # fmt: skip
    proc = run(["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", f"RUN_DIR={run_dir}", "model=small_cnn", *data,
                "trainer.epochs=1"], expect_ok=False, timeout=120)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: data set item 3") and str(broken) in last and "truncated" in last, last
    assert "Traceback" not in proc.stdout + proc.stderr, "the traceback goes to the rank's log file"
    logs = "".join(path.read_text() for path in (run_dir / "logs").glob("rank_*.log"))
    assert "Traceback" in logs and logs.count("run dir:") == 2, "one start per rank: torchrun restarted nobody"

"""datasets/shards.py: an image folder written as shards (to a folder or a store), read back as the items
data=image_folder gives, through a bounded cache for a store. Another kind of shards: its own test file."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.datasets import image_folder, sharded
from {{cookiecutter.package_name}}.datasets.prepare import main as prepare
from {{cookiecutter.package_name}}.datasets.shards import ShardedSet, image_splits, write_shards
from {{cookiecutter.package_name}}.engine.data.sampler import ResumableDistributedSampler

from ..helpers import cpu_env, write_image_tree


def images(root: Path) -> Path:
    """An image folder of 3 classes, 12 training and 3 validation images each."""
    return write_image_tree(root, 3, 12, 3, (12, 10))


def test_an_image_folder_becomes_shards_of_the_items_image_folder_gives(tmp_path: Path) -> None:
    source, out = write_image_tree(tmp_path / "images", 3, 4, 2, (12, 10)), tmp_path / "shards"
    args = ["shards", str(source), str(out), "--kind", "images", "--samples-per-shard", "5", "--image-size", "8"]
    assert prepare(args) == 0
    index = json.loads((out / "index.json").read_text())
    assert index["kind"] == "images" and index["classes"] == ["class_0", "class_1", "class_2"]
    names = ["index.json", "train-00000.pt", "train-00001.pt", "train-00002.pt", "val-00000.pt", "val-00001.pt"]
    assert sorted(path.name for path in out.iterdir()) == names
    assert torch.load(out / "train-00002.pt", weights_only=True)["images"].dtype == torch.uint8
    train, val = sharded(str(out), num_classes=3)
    assert (train.shard_sizes, val.shard_sizes, train.shard_window) == ([5, 5, 2], [5, 1], 4)
    folder_train, _ = image_folder(str(source), image_size=8, num_classes=3)
    written = torch.randperm(12, generator=torch.Generator().manual_seed(0))  # shuffled once, by --seed
    for index in range(12):
        image, label = train[index]
        expected_image, expected_label = folder_train[int(written[index])]
        assert torch.equal(image, expected_image) and label == expected_label
    worker_copy = pickle.loads(pickle.dumps(train))  # what a spawned DataLoader worker gets
    assert not worker_copy.opened and torch.equal(worker_copy[11][0], train[11][0])
    with pytest.raises(IndexError):
        train[12]
    with pytest.raises(ConfigError, match="holds 3 classes, data.num_classes=10"):
        sharded(str(out), num_classes=10)
    with pytest.raises(ConfigError, match=r"^data.dataset.colours is not a setting of data=shards: give one of \["):
        sharded(str(out), colours=3)  # a key no kind of this project reads: refused, not ignored
    assert prepare(args) == 2, "a prepared data set is never written over"
    prepared_id = json.loads((out / "index.json").read_text())["id"]
    assert train.prepared == {"root": str(out), "id": prepared_id}, "what a checkpoint records of it"


def test_an_image_that_does_not_read_is_named_in_one_line(tmp_path: Path, capsys) -> None:
    source = write_image_tree(tmp_path / "images", 2, 3, 1, (12, 10))
    (source / "train" / "class_1" / "2.png").write_bytes(b"not an image")
    assert prepare(["shards", str(source), str(tmp_path / "shards"), "--kind", "images"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {source / 'train' / 'class_1' / '2.png'} is not a readable image (")
    assert err.endswith("): fix or remove it, then prepare again\n") and err.count("\n") == 1, err
    assert not (tmp_path / "shards" / "index.json").exists()


def test_a_data_set_whose_writing_stopped_has_no_index_and_is_refused(tmp_path: Path) -> None:
    splits, meta = image_splits(str(images(tmp_path / "images")), image_size=8)
    count, gather = splits["train"]

    def fails_at_the_second_shard(indices: torch.Tensor) -> dict:
        if int(indices.numel()) and fails_at_the_second_shard.calls:
            raise OSError("disk full")
        fails_at_the_second_shard.calls += 1
        return gather(indices)

    fails_at_the_second_shard.calls = 0
    with pytest.raises(OSError, match="disk full"):
        write_shards(str(tmp_path / "out"), "images", {"train": (count, fails_at_the_second_shard)}, 5, 0, **meta)
    assert [path.name for path in (tmp_path / "out").iterdir()] == ["train-00000.pt"], "the index comes last"
    with pytest.raises(ConfigError, match=r"holds no index.json: prepare it first with `python -m .*prepare shards"):
        sharded(str(tmp_path / "out"))


@pytest.mark.slow
def test_shards_in_a_store_stream_through_a_bounded_cache(tmp_path: Path, s3_server) -> None:
    source = images(tmp_path / "images")
    url = s3_server.bucket() + "/data/images"
    common = ["--kind", "images", "--samples-per-shard", "9", "--image-size", "8"]
    assert prepare(["shards", str(source), url, *common]) == 0
    assert prepare(["shards", str(source), str(tmp_path / "local"), *common]) == 0
    index = json.loads((tmp_path / "local" / "index.json").read_text())
    shard_bytes = max(entry["bytes"] for entry in index["splits"]["train"])
    train, _ = sharded(url, str(tmp_path / "cache"), cache_limit_gb=2 * shard_bytes / 1e9, shard_window=1)
    local, _ = sharded(str(tmp_path / "local"), shard_window=1)
    assert train.cache is not None and train.cache.folder.parent == tmp_path / "cache" and local.cache is None
    sampler = ResumableDistributedSampler.for_dataset(train, cpu_env(0, 1), 4, seed=0)
    most = 0
    for index, _, _ in sampler:  # the order a rank reads: a shard (a window of one) at a time
        x, y = train[index]
        assert torch.equal(x, local[index][0]) and y == local[index][1]
        most = max(most, train.cache.size())
    assert len(train.shard_sizes) == 4 and most <= train.cache.limit_bytes + shard_bytes, "over it only by one in use"


def test_a_cache_too_small_for_a_window_is_refused_and_a_forked_worker_lets_go_of_its_parents_shards(
    tmp_path: Path,
) -> None:
    url = "memory://shards-test/images"  # a store in this process (fsspec's), read as s3:// is
    args = ["--kind", "images", "--samples-per-shard", "9", "--image-size", "8"]
    assert prepare(["shards", str(images(tmp_path / "images")), url, *args]) == 0
    with pytest.raises(ConfigError, match="data.cache_limit_gb=5e-06 holds fewer than data.shard_window=4 shards"):
        sharded(url, cache_limit_gb=5e-6)
    train, _ = sharded(url, str(tmp_path), cache_limit_gb=5e-6, shard_window=1)
    train[0]
    (parents,) = [fd for fd, _ in train.opened.values()]
    shard_file = os.fstat(parents).st_ino
    pid = os.fork()  # as a DataLoader worker starts
    if pid == 0:
        train[len(train) - 1]
        try:  # still open, the shard would stay marked in use as long as the worker lives
            os._exit(1 if os.fstat(parents).st_ino == shard_file else 0)
        except OSError:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert os.fstat(parents).st_ino == shard_file, "the parent's own stays open"


# --- the training order: a few shards at a time (ShardedSet.sample_order, drawn by the sampler from (seed, epoch))


def unread(sizes: list[int], window: int) -> ShardedSet:
    """A split of shards of these sizes, none read: the order needs only their sizes."""
    index = {"splits": {"train": [{"name": f"{k:05d}", "bytes": 1, "samples": n} for k, n in enumerate(sizes)]}}
    return ShardedSet("/nowhere", index, "train", None, window, kind=None)


SHARD_SIZES = [10, 10, 7, 10, 10, 10, 3, 10, 10, 10, 10, 10]  # 110 samples, two short shards


def sharded_keys(world_size: int, epoch: int, seed: int = 7, window: int = 3, start: int = 0) -> list[list]:
    result, shards = [], unread(SHARD_SIZES, window)
    for rank in range(world_size):
        sampler = ResumableDistributedSampler.for_dataset(shards, cpu_env(rank, world_size), 4, seed)
        sampler.set_epoch(epoch)
        sampler.set_start(start)
        result.append(list(sampler))
    return result


def test_a_sharded_order_is_one_permutation_of_seed_and_epoch_at_any_world_size() -> None:
    def order(seed: int, epoch: int, world_size: int = 1) -> list[int]:
        per_rank = sharded_keys(world_size, epoch, seed)
        steps = range(0, len(per_rank[0]), 4)
        return [i for step in steps for keys in per_rank for i, _, weight in keys[step : step + 4] if weight > 0]

    assert sorted(order(3, 2)) == list(range(110))
    assert order(3, 2) == order(3, 2, world_size=2) == order(3, 2, world_size=5)
    assert order(3, 2) != order(3, 1) and order(3, 2) != order(4, 2)
    assert order(3, 2) != ResumableDistributedSampler(110, cpu_env(0, 1), 4, seed=3).epoch_order().tolist()
    plain = ResumableDistributedSampler.for_dataset(range(110), cpu_env(0, 1), 4, seed=3)
    assert plain.epoch_order().tolist() == ResumableDistributedSampler(110, cpu_env(0, 1), 4, 3).epoch_order().tolist()


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_a_sharded_order_keeps_each_ranks_reads_within_a_window_of_shards(world_size: int) -> None:
    window = 3
    shard_of = [shard for shard, size in enumerate(SHARD_SIZES) for _ in range(size)]
    sampler = ResumableDistributedSampler.for_dataset(unread(SHARD_SIZES, window), cpu_env(0, 1), 4, seed=7)
    sampler.set_epoch(1)
    order = sampler.epoch_order().tolist()
    shard_sequence = list(dict.fromkeys(shard_of[i] for i in order))
    assert len({shard_of[i] for i in order[:10]}) > 1, "a window's samples are mixed, not read shard by shard"
    window_of = {shard: position // window for position, shard in enumerate(shard_sequence)}
    assert sorted(shard_sequence) == list(range(len(SHARD_SIZES))), "every shard read, one window after the other"
    for keys in sharded_keys(world_size, epoch=1, window=window):
        windows = [window_of[shard_of[index]] for index, _, _ in keys]
        assert windows == sorted(windows), "a rank never goes back to an earlier window"
    real = [i for keys in sharded_keys(world_size, epoch=1) for i, _, weight in keys if weight > 0]
    assert sorted(real) == list(range(110)), "disjoint ranks, every sample once"


def test_a_sharded_order_resumes_mid_epoch_on_another_world_size() -> None:
    done = [i for keys in sharded_keys(2, epoch=4) for i, _, weight in keys[:12] if weight > 0]
    rest = [i for keys in sharded_keys(3, epoch=4, start=len(done)) for i, _, weight in keys if weight > 0]
    assert sorted(done + rest) == list(range(110))


def test_the_order_of_a_seed_and_epoch_never_changes_so_an_older_runs_checkpoint_resumes_on_its_samples() -> None:
    sampler = ResumableDistributedSampler.for_dataset(unread([4, 4, 4], 1), cpu_env(0, 1), 4, seed=0)
    sampler.set_epoch(0)
    assert sampler.epoch_order().tolist() == [11, 10, 8, 9, 1, 0, 3, 2, 5, 4, 6, 7]

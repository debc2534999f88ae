"""datasets/shard_cache.py: a store's shards fetched once per node, whole or not at all, the least recently
used evicted, never one in use (a local folder plays the store: the fetching is fsspec's either way)."""

from __future__ import annotations

import os
import pickle
import threading
import time
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.common.errors import JobError
from {{cookiecutter.package_name}}.datasets import shard_cache
from {{cookiecutter.package_name}}.datasets.shard_cache import ShardCache, cache_folder

SIZE = 1000


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A "store" of five shards of SIZE bytes, each byte its shard's number."""
    folder = tmp_path / "store"
    folder.mkdir()
    for number in range(5):
        (folder / f"s{number}.pt").write_bytes(bytes([number]) * SIZE)
    return folder


def cached(tmp_path: Path) -> list[str]:
    return sorted(path.name for path in (tmp_path / "cache").iterdir() if not path.name.startswith("."))


def use(cache: ShardCache, name: str) -> bytes:
    fd, path = cache.open(name, SIZE)
    try:
        return path.read_bytes()
    finally:
        os.close(fd)


def test_shards_are_fetched_once_and_the_least_recently_used_evicted(store: Path, tmp_path: Path, monkeypatch) -> None:
    cache = ShardCache(str(store), tmp_path / "cache", limit_bytes=int(2.5 * SIZE))
    fetched = []
    fs, _ = cache.remote("x")  # fsspec's one local file system: patched for this test only
    original = fs.get_file
    monkeypatch.setattr(
        fs, "get_file", lambda remote, local: fetched.append(Path(remote).name) or original(remote, local)
    )
    assert use(cache, "s0.pt") == bytes([0]) * SIZE
    use(cache, "s1.pt")
    time.sleep(0.01)  # access times a file system can tell apart
    use(cache, "s0.pt")  # s0 now used more recently than s1
    time.sleep(0.01)
    use(cache, "s2.pt")
    assert cached(tmp_path) == ["s0.pt", "s2.pt"], "s1, the least recently used, made room"
    assert fetched == ["s0.pt", "s1.pt", "s2.pt"], "a shard the cache holds is not fetched again"
    assert cache.size() <= cache.limit_bytes


def test_a_shard_in_use_is_never_evicted(store: Path, tmp_path: Path) -> None:
    cache = ShardCache(str(store), tmp_path / "cache", limit_bytes=SIZE)
    held, _ = cache.open("s0.pt", SIZE)  # the oldest, but another process reads it
    for name in ("s1.pt", "s2.pt"):
        use(cache, name)
        time.sleep(0.01)
    assert cached(tmp_path) == ["s0.pt", "s2.pt"], "over the limit only by the shard in use"
    os.close(held)
    use(cache, "s3.pt")
    assert cached(tmp_path) == ["s3.pt"]


def test_processes_that_need_one_shard_at_once_fetch_it_once(store: Path, tmp_path: Path, monkeypatch) -> None:
    cache = ShardCache(str(store), tmp_path / "cache", limit_bytes=10 * SIZE)
    fs, _ = cache.remote("x")
    fetches = []
    original = fs.get_file

    def slow_get_file(remote: str, local: str) -> None:
        fetches.append(remote)
        time.sleep(0.2)  # the others arrive while it downloads
        original(remote, local)

    monkeypatch.setattr(fs, "get_file", slow_get_file)
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(use(cache, "s4.pt"))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [bytes([4]) * SIZE] * 4 and len(fetches) == 1


def test_a_download_that_dies_halfway_leaves_no_shard_and_a_bad_size_is_refused(
    store: Path, tmp_path: Path, monkeypatch
) -> None:
    cache = ShardCache(str(store), tmp_path / "cache", limit_bytes=10 * SIZE)
    fs, _ = cache.remote("x")
    original = fs.get_file

    def dies_halfway(remote: str, local: str) -> None:
        Path(local).write_bytes(b"\0" * (SIZE // 2))
        raise ConnectionError("the connection dropped")

    monkeypatch.setattr(fs, "get_file", dies_halfway)
    monkeypatch.setattr(shard_cache, "RETRY_S", 0)  # no retry: test_a_store_that_fails_for_a_while_is_retried
    with pytest.raises(JobError, match="s1.pt could not be fetched .*ConnectionError: the connection dropped"):
        cache.open("s1.pt", SIZE)
    assert cached(tmp_path) == [], "nothing under the shard's name"
    monkeypatch.setattr(fs, "get_file", original)
    assert use(cache, "s1.pt") == bytes([1]) * SIZE, "the next use fetches it whole"
    with pytest.raises(JobError, match="s2.pt is 1000 bytes, its index.json says 999"):
        cache.open("s2.pt", 999)
    assert cached(tmp_path) == ["s1.pt"] and not list((tmp_path / "cache").glob("*.part")), "nor a part file"


def test_the_cache_pickles_without_its_client_and_its_folder_is_per_data_set(store: Path, tmp_path: Path) -> None:
    cache = ShardCache(str(store), tmp_path / "cache", limit_bytes=SIZE)
    cache.remote("x")
    copy = pickle.loads(pickle.dumps(cache))
    assert copy.client is None and use(copy, "s0.pt") == bytes([0]) * SIZE
    folder = cache_folder("", "s3://bucket/data", "id1")
    assert folder == cache_folder("", "s3://bucket/data", "id1"), "the ranks of a node share one folder"
    assert folder != cache_folder("", "s3://bucket/data", "id2") != cache_folder("", "s3://bucket/other", "id1")
    assert cache_folder(str(tmp_path), "s3://bucket/data", "id1").parent == tmp_path


class Clock:
    """time.monotonic and time.sleep for shard_cache: a sleep moves the clock on at once, and is listed."""

    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_store_that_fails_for_a_while_is_retried_with_doubling_waits_then_stops_in_one_line(
    store: Path, tmp_path: Path, monkeypatch, caplog
) -> None:
    cache = ShardCache(str(store), tmp_path / "cache", limit_bytes=10 * SIZE)
    fs, _ = cache.remote("x")
    original, failures = fs.get_file, [3]

    def down_for_a_while(remote: str, local: str) -> None:
        if failures[0]:
            failures[0] -= 1
            raise ConnectionError("connection refused")
        original(remote, local)

    monkeypatch.setattr(fs, "get_file", down_for_a_while)
    monkeypatch.setattr(shard_cache, "time", clock := Clock())
    assert use(cache, "s1.pt") == bytes([1]) * SIZE
    assert clock.sleeps == [0.5, 1.0, 2.0] and "retrying in 1.0 s" in caplog.text
    failures[0], clock.sleeps = 1000, []  # down for good: stops after RETRY_S, the last wait cut to fit
    with pytest.raises(JobError, match=r"s2.pt could not be fetched for 120 s \(ConnectionError: connection refused\)"):
        cache.open("s2.pt", SIZE)
    assert clock.sleeps == [0.5, 1, 2, 4, 8, 15, 15, 15, 15, 15, 15, 14.5] and sum(clock.sleeps) == 120
    assert cached(tmp_path) == ["s1.pt"]

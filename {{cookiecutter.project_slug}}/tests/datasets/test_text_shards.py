"""datasets/text_shards.py: `prepare shards --kind text`, a corpus into windows that hold every byte of each
split, read back as the items data=text gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.datasets import sharded
from {{cookiecutter.package_name}}.datasets.prepare import main as prepare


def corpus(root: Path) -> Path:
    root.mkdir()
    for number in range(3):  # file 0 is validation (--val-every 3), as data=text splits
        (root / f"{number}.txt").write_bytes(bytes(range(number * 50, number * 50 + 90)) * 3)
    return root


def test_a_corpus_becomes_windows_that_hold_every_byte_of_each_split(tmp_path: Path) -> None:
    source, out = corpus(tmp_path / "corpus"), tmp_path / "shards"
    args = ["shards", str(source), str(out), "--kind", "text", "--samples-per-shard", "7", "--seq-len", "16",
            "--val-every", "3"]  # fmt: skip
    assert prepare(args) == 0
    train, val = sharded(str(out), block_size=16)
    for split, files in ((train, [1, 2]), (val, [0])):
        stream = b"".join((source / f"{number}.txt").read_bytes() for number in files)
        items = [split[index] for index in range(len(split))]
        assert all(x.dtype == torch.long and x.shape == (16,) and torch.equal(x[1:], y[:-1]) for x, y in items)
        starts = sorted(bytes(torch.cat([x, y[-1:]]).tolist()) for x, y in items)
        assert starts == sorted(stream[begin : begin + 17] for begin in range(0, len(stream) - 16, 16))
    assert prepare(["tokens", str(source), str(source / "tokens")]) == 0  # prepared data inside the corpus
    assert prepare([*args[:2], str(source / "again"), *args[3:]]) == 0
    again, _ = sharded(str(source / "again"))
    assert again.shard_sizes == train.shard_sizes, "neither the token folder nor OUT read as text"
    with pytest.raises(ConfigError, match="windows of 16 bytes, data.block_size=64"):
        sharded(str(out), block_size=64)
    assert prepare(["shards", str(tmp_path / "nowhere"), str(tmp_path / "other"), "--kind", "text"]) == 2

"""`prepare shards --kind text` (datasets/shards.py, which finds this module by its SHARD_KIND): a text corpus
(as `text` reads it) into windows of seq_len + 1 bytes, overlapping by one, so that the windows of a split
together hold each of its bytes; read back as `text`'s items are, (bytes, the same shifted by one) as int64."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from ..common.errors import ConfigError
from .shards import SPLITS, Splits


class TextShards:
    """`--kind text`: the windows of a corpus's bytes."""

    name = "text"
    source = "text: a folder, a quoted glob pattern, or 'stdlib' (the Python standard library)"
    sizes = ("block_size",)  # the data set's settings that must agree with what was prepared

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--seq-len", type=int, default=64, help="text: bytes of context (data.block_size)")
        parser.add_argument("--val-every", type=int, default=10, help="text: every Nth file (by path) is validation")

    @staticmethod
    def least(args: argparse.Namespace) -> tuple[tuple[str, int, int], ...]:
        return (("--seq-len", args.seq_len, 1), ("--val-every", args.val_every, 2))

    @staticmethod
    def splits(args: argparse.Namespace, exclude: tuple[Path, ...]) -> Splits:
        source = args.source
        if source != "stdlib" and not any(char in source for char in "*?[") and not Path(source).is_dir():
            raise ConfigError(f"SOURCE {source} is not a folder, a glob pattern or 'stdlib': give one of those")
        return text_splits(None if source == "stdlib" else source, args.seq_len, args.val_every, exclude)

    @staticmethod
    def item(tensors: dict[str, torch.Tensor], row: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = tensors["tokens"][row].long()
        return window[:-1], window[1:]

    @staticmethod
    def check(root: str, index: dict[str, Any], sizes: dict[str, int]) -> None:
        block_size = sizes.get("block_size", 0)
        if block_size and block_size != index["seq_len"]:
            raise ConfigError(
                f"data.root={root} holds windows of {index['seq_len']} bytes, "
                f"data.block_size={block_size}: make them agree (or prepare it again with --seq-len)"
            )


def text_splits(source: str | None, seq_len: int, val_every: int,
                exclude: tuple[Path, ...] = ()) -> Splits:  # fmt: skip
    """The splits of a corpus, split by file as `text` splits it (the folders `exclude` names and other
    prepared data left out), as windows of seq_len + 1 bytes that start every seq_len bytes."""
    from .corpus import text_files

    files = text_files(source, exclude)
    if len(files) < 2:
        raise ConfigError(f"corpus {source}: found {len(files)} file(s); a text corpus needs at least 2")
    streams: tuple[bytearray, bytearray] = (bytearray(), bytearray())
    for number, path in enumerate(files):
        streams[number % val_every == 0].extend(path.read_bytes())
    splits = {}
    for split, stream in zip(SPLITS, streams, strict=True):
        data = torch.frombuffer(stream, dtype=torch.uint8) if stream else torch.zeros(0, dtype=torch.uint8)
        if len(data) < seq_len + 1:
            raise ConfigError(f"corpus {source}: the {split} split holds {len(data)} bytes, fewer than --seq-len + 1")
        windows = data.unfold(0, seq_len + 1, seq_len)
        splits[split] = (len(windows), lambda indices, windows=windows: {"tokens": windows[indices].contiguous()})
    return splits, {"seq_len": seq_len}


SHARD_KIND = TextShards

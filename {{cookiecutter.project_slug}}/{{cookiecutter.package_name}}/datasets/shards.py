"""Data in shards, read from a local folder or an object store (s3://), docs/data_at_scale.md.

Prepared once (`python -m <package>.datasets.prepare shards SOURCE OUT`, prepare.py): an image folder
(as `image_folder` reads it) or a text corpus (as `text` reads it) into OUT/train-NNNNN.pt and
OUT/val-NNNNN.pt, a fixed number of samples each, shuffled once as they are written, then OUT/index.json,
written last: a data set whose index is there is whole. A shard is one torch.save of tensors only
(loaded with weights_only=True): images as uint8 (N, 3, S, S) and labels, or text as windows of
seq_len + 1 bytes, overlapping by one, so that the windows of a split together hold each of its bytes.

Training (`data=shards`) reads the items image_folder's and text's are: normalised float images and
integer labels; (bytes, the same shifted by one) as int64. A set is map-style: item i is found through
the index, its shard loaded (memory-mapped) from the folder or, for a store, from the node's cache
(shard_cache.py). Its `shard_sizes` make the sampler's order shard-aware (engine/data/sampler.py); its
`prepared` (the index's id) is what a checkpoint records of the data (engine/assembly/compatibility.py).
"""

from __future__ import annotations

import argparse
import bisect
import io
import itertools
import json
import os
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from ..common.errors import ConfigError, first_line, say
from ..common.storage import check_reachable, filesystem, is_remote
from .images import check_image_tree, normalise
from .shard_cache import ShardCache, cache_folder

FORMAT = 1
INDEX = "index.json"
SPLITS = ("train", "val")
KINDS = ("images", "text")
PREPARE_COMMAND = f"python -m {__package__}.prepare shards"
PREPARE_HELP = "an image folder or a text corpus into shards, to a folder or s3://"  # prepare --help


# --- preparing: samples into shards, the index last


def write_shards(out: str, kind: str, splits: dict[str, tuple[int, Any]], samples_per_shard: int, seed: int,
                 **meta: Any) -> dict[str, Any]:  # fmt: skip
    """Write each split's `count` samples, drawn by `gather(indices) -> {name: tensor}` in a permutation
    of `seed`, as shards of `samples_per_shard` to `out` (a folder or an fsspec URL), then the index."""
    fs, path = filesystem(out)
    if is_remote(out):
        check_reachable(out, "OUT")
    if fs.exists(f"{path}/{INDEX}"):
        raise ConfigError(f"{out} already holds a prepared data set ({INDEX}): give another OUT or remove it")
    fs.makedirs(path, exist_ok=True)
    index: dict[str, Any] = {"format": FORMAT, "kind": kind, "id": uuid.uuid4().hex, **meta, "splits": {}}
    for split, (count, gather) in splits.items():
        order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))  # no shard of one class
        index["splits"][split] = shards = []
        for number, begin in enumerate(range(0, count, samples_per_shard)):
            buffer = io.BytesIO()
            torch.save(gather(order[begin : begin + samples_per_shard]), buffer)
            name = f"{split}-{number:05d}.pt"
            fs.pipe_file(f"{path}/{name}", buffer.getvalue())
            shards.append({"name": name, "samples": min(samples_per_shard, count - begin), "bytes": buffer.tell()})
    fs.pipe_file(f"{path}/{INDEX}", (json.dumps(index, indent=1) + "\n").encode())
    return index


def image_splits(source: str, image_size: int) -> tuple[dict[str, tuple[int, Any]], dict[str, Any]]:
    """The splits of an image folder (SOURCE/train/<class>/*, SOURCE/val/<class>/*) as uint8 images
    resized as image_folder resizes them, and the index's own keys (the classes, the size)."""
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.Resize((image_size, image_size)), transforms.PILToTensor()])
    splits, classes = {}, None
    for split in SPLITS:
        folder = Path(source) / split
        check_image_tree(folder, len([entry for entry in folder.iterdir() if entry.is_dir()]) if folder.is_dir() else 0)
        images = datasets.ImageFolder(str(folder), transform=transform)
        if classes is not None and images.classes != classes:
            raise ConfigError(f"{source}: train/ and val/ have other class folders: make them agree")
        classes = images.classes

        def gather(indices: torch.Tensor, images: Any = images) -> dict[str, torch.Tensor]:
            items = [read_image(images, index) for index in indices.tolist()]
            return {"images": torch.stack([image for image, _ in items]),
                    "labels": torch.tensor([label for _, label in items], dtype=torch.long)}  # fmt: skip

        splits[split] = (len(images), gather)
    return splits, {"classes": classes, "image_size": image_size}


def read_image(images: Any, index: int) -> tuple[torch.Tensor, int]:
    """Item `index` of a torchvision ImageFolder; a file that is no image is one line naming it. The
    shards written so far stay without an index: not a data set until a prepare finishes."""
    try:
        return images[index]
    except Exception as error:  # PIL's UnidentifiedImageError, OSError of a truncated file, ...
        raise ConfigError(f"{images.samples[index][0]} is not a readable image ({first_line(error)}): fix or "
                          "remove it, then prepare again") from None  # fmt: skip


def text_splits(source: str | None, seq_len: int, val_every: int,
                exclude: tuple[Path, ...] = ()) -> tuple[dict[str, tuple[int, Any]], dict[str, Any]]:  # fmt: skip
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


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    """`prepare shards`'s arguments (prepare.py)."""
    parser.add_argument("source", metavar="SOURCE", help="images: a folder of train/<class>/ and val/<class>/; "
                        "text: a folder, a quoted glob pattern, or 'stdlib' (the Python standard library)")  # fmt: skip
    parser.add_argument("out", metavar="OUT", help="the folder or store to write (s3://bucket/prefix)")
    parser.add_argument("--kind", choices=KINDS, required=True, help="what SOURCE holds")
    parser.add_argument("--samples-per-shard", type=int, default=1024, help="samples in each shard file")
    parser.add_argument("--image-size", type=int, default=32, help="images: resized to this size squared")
    parser.add_argument("--seq-len", type=int, default=64, help="text: bytes of context (data.block_size)")
    parser.add_argument("--val-every", type=int, default=10, help="text: every Nth file (by path) is validation")
    parser.add_argument("--seed", type=int, default=0, help="the shuffle of the samples as they are written")
    parser.set_defaults(prepare=run_prepare)


def run_prepare(args: argparse.Namespace) -> int:
    """`prepare shards`: the shards and the index written, summed up in one line."""
    for name, value, least in (("--samples-per-shard", args.samples_per_shard, 1), ("--image-size", args.image_size, 8),
                               ("--seq-len", args.seq_len, 1), ("--val-every", args.val_every, 2)):  # fmt: skip
        if value < least:
            raise ConfigError(f"{name} must be >= {least}, got {value}")
    if args.kind == "images":
        if not Path(args.source).is_dir():
            raise ConfigError(f"SOURCE {args.source} is not a folder: give one with train/<class>/ and val/<class>/")
        splits, meta = image_splits(args.source, args.image_size)
    elif args.source != "stdlib" and not any(char in args.source for char in "*?[") and not Path(args.source).is_dir():
        raise ConfigError(f"SOURCE {args.source} is not a folder, a glob pattern or 'stdlib': give one of those")
    else:
        exclude = () if is_remote(args.out) else (Path(args.out.removeprefix("file://")),)  # OUT inside SOURCE
        splits, meta = text_splits(None if args.source == "stdlib" else args.source, args.seq_len, args.val_every,
                                   exclude)  # fmt: skip
    index = write_shards(args.out, args.kind, splits, args.samples_per_shard, args.seed, **meta)
    counts = {split: sum(shard["samples"] for shard in index["splits"][split]) for split in SPLITS}
    say(f"{args.out}: {counts['train']:,} training and {counts['val']:,} validation samples in "
        f"{sum(len(shards) for shards in index['splits'].values())} shards; train with data=shards "
        f"data.root={args.out}")  # fmt: skip
    return 0


# --- training: items found through the index, shards from the folder or the node's cache


class ShardedSet(Dataset):
    """One split of a prepared data set: item i from the shard that holds it. A process keeps the
    shards it read last open (memory-mapped, marked in use in the cache), enough for two windows
    of the sampler's order; they are never pickled: each DataLoader worker opens its own."""

    def __init__(self, root: str, index: dict[str, Any], split: str, cache: ShardCache | None, window: int) -> None:
        self.root, self.kind, self.cache, self.shard_window = root.rstrip("/"), index["kind"], cache, window
        self.root = self.root if cache is not None else self.root.removeprefix("file://")
        self.names = [shard["name"] for shard in index["splits"][split]]
        self.shard_bytes = [shard["bytes"] for shard in index["splits"][split]]
        self.shard_sizes = [shard["samples"] for shard in index["splits"][split]]
        self.starts = list(itertools.accumulate(self.shard_sizes, initial=0))
        self.opened: OrderedDict[int, tuple[int | None, dict[str, torch.Tensor]]] = OrderedDict()
        self.pid = os.getpid()
        self.prepared: dict[str, str] | None = None  # {"root", "id"} of the data set: sharded() sets it

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} of a set of {len(self)}")
        shard = bisect.bisect_right(self.starts, index) - 1
        tensors, row = self.shard(shard), index - self.starts[shard]
        if self.kind == "images":
            return normalise(tensors["images"][row]), int(tensors["labels"][row])
        window = tensors["tokens"][row].long()
        return window[:-1], window[1:]

    def shard(self, number: int) -> dict[str, torch.Tensor]:
        """The tensors of shard `number`, opened (and fetched) on first use, kept for the next uses."""
        if self.pid != os.getpid():  # a forked worker: its copies of the parent's descriptors would keep
            for fd, _ in self.opened.values():  # those shards marked in use for the worker's whole life
                if fd is not None:
                    os.close(fd)
            self.opened, self.pid = OrderedDict(), os.getpid()
        if number in self.opened:
            self.opened.move_to_end(number)
            return self.opened[number][1]
        fd, path = None, Path(f"{self.root}/{self.names[number]}")
        if self.cache is not None:
            fd, path = self.cache.open(self.names[number], self.shard_bytes[number])
        tensors = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        self.opened[number] = (fd, tensors)
        while len(self.opened) > 2 * self.shard_window:
            self.close_shard(next(iter(self.opened)))
        return tensors

    def close_shard(self, number: int) -> None:
        fd, _ = self.opened.pop(number)
        if fd is not None:
            os.close(fd)  # its pages stay mapped until the tensors go; the cache may evict it now

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "opened": OrderedDict()}


def read_index(root: str) -> dict[str, Any]:
    """OUT/index.json of a prepared data set; one line where there is none or it is not one."""
    fs, path = filesystem(root)
    if is_remote(root):
        check_reachable(root, "data.root")
    try:
        index = json.loads(fs.cat_file(f"{path.rstrip('/')}/{INDEX}"))
    except FileNotFoundError:
        raise ConfigError(f"data.root={root} holds no {INDEX}: prepare it first with "
                          f"`{PREPARE_COMMAND} SOURCE {root} --kind images|text`") from None  # fmt: skip
    if index.get("format") != FORMAT or index.get("kind") not in KINDS:
        raise ConfigError(f"data.root={root}: {INDEX} is of format {index.get('format')} and kind "
                          f"{index.get('kind')}, this code reads format {FORMAT}: prepare it again")  # fmt: skip
    return index


def sharded(root: str, cache_dir: str = "", cache_limit_gb: float = 10.0, shard_window: int = 4, num_classes: int = 0,
           block_size: int = 0) -> tuple[ShardedSet, ShardedSet]:  # fmt: skip
    """The (train, val) pair of the data set prepared at `root` (a folder or s3://bucket/prefix). A
    store's shards are cached under `cache_dir` ("": the system's temp dir), at most about
    `cache_limit_gb` for this data set on each node; the training order reads `shard_window` shards at a
    time. `num_classes` (images) and `block_size` (text) must agree with the data set where they are set."""
    index = read_index(root)
    if shard_window < 1:
        raise ConfigError(f"data.shard_window must be >= 1, got {shard_window}")
    if index["kind"] == "images" and num_classes and num_classes != len(index["classes"]):
        raise ConfigError(f"data.root={root} holds {len(index['classes'])} classes, data.num_classes={num_classes}: "
                          "make them agree")  # fmt: skip
    if index["kind"] == "text" and block_size and block_size != index["seq_len"]:
        raise ConfigError(f"data.root={root} holds windows of {index['seq_len']} bytes, data.block_size={block_size}"
                          ": make them agree (or prepare it again with --seq-len)")  # fmt: skip
    cache = None
    if is_remote(root):
        largest = max(shard["bytes"] for shards in index["splits"].values() for shard in shards)
        if cache_limit_gb * 1e9 < shard_window * largest:
            raise ConfigError(f"data.cache_limit_gb={cache_limit_gb} holds fewer than data.shard_window={shard_window}"
                              f" shards of {largest / 1e6:.3g} MB: raise it to at least "
                              f"{shard_window * largest / 1e9:.3g}")  # fmt: skip
        cache = ShardCache(root, cache_folder(cache_dir, root, index["id"]), int(cache_limit_gb * 1e9))
    train, val = (ShardedSet(root, index, split, cache, shard_window) for split in SPLITS)
    train.prepared = val.prepared = {"root": root, "id": index["id"]}  # new at each prepare: a checkpoint records it
    return train, val


BUILDABLE = (sharded,)  # what a checkpoint's config may build, found by datasets/__init__.py

"""Data in shards, read from a local folder or an object store (s3://), docs/data_at_scale.md.

Prepared once (`python -m <package>.datasets.prepare shards SOURCE OUT --kind KIND`, prepare.py): an image
folder (as `image_folder` reads it), or what another kind prepares (a module beside this one with a
`SHARD_KIND`, found by what is present), into OUT/train-NNNNN.pt and OUT/val-NNNNN.pt, a fixed number of
samples each, shuffled once as they are written, then OUT/index.json, written last: a data set whose index
is there is whole. A shard is one torch.save of tensors only (loaded with weights_only=True): images as
uint8 (N, 3, S, S) and labels.

Training (`data=shards`) reads the items the kind's own data set gives (images: normalised float images
and integer labels, as image_folder's). A set is map-style: item i is found through
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
from ..common.object_store import check_reachable, filesystem
from ..common.registry import modules_with
from ..common.storage import is_remote
from .images import check_image_tree, normalise
from .shard_cache import ShardCache, cache_folder

FORMAT = 1
INDEX = "index.json"
SPLITS = ("train", "val")
Splits = tuple[dict[str, tuple[int, Any]], dict[str, Any]]  # each split's (count, gather), the index's own keys
PREPARE_COMMAND = f"python -m {__package__}.prepare shards"
PREPARE_HELP = "a data set (--kind) into shards, to a folder or s3://"  # prepare --help


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


def image_splits(source: str, image_size: int) -> Splits:
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


class ImageShards:
    """`--kind images`: an image folder into uint8 images and labels, read back as image_folder's items.
    Another kind is a class like this one in a module beside this one, named by its `SHARD_KIND`."""

    name = "images"
    source = "images: a folder of train/<class>/ and val/<class>/"
    sizes = ("num_classes",)  # the data set's settings that must agree with what was prepared

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--image-size", type=int, default=32, help="images: resized to this size squared")

    @staticmethod
    def least(args: argparse.Namespace) -> tuple[tuple[str, int, int], ...]:
        return (("--image-size", args.image_size, 8),)

    @staticmethod
    def splits(args: argparse.Namespace, exclude: tuple[Path, ...]) -> Splits:
        if not Path(args.source).is_dir():
            raise ConfigError(f"SOURCE {args.source} is not a folder: give one with train/<class>/ and val/<class>/")
        return image_splits(args.source, args.image_size)

    @staticmethod
    def item(tensors: dict[str, torch.Tensor], row: int) -> tuple[torch.Tensor, Any]:
        return normalise(tensors["images"][row]), int(tensors["labels"][row])

    @staticmethod
    def check(root: str, index: dict[str, Any], sizes: dict[str, int]) -> None:
        num_classes = sizes.get("num_classes", 0)
        if num_classes and num_classes != len(index["classes"]):
            raise ConfigError(f"data.root={root} holds {len(index['classes'])} classes, data.num_classes={num_classes}"
                              ": make them agree")  # fmt: skip


def shard_kinds() -> dict[str, Any]:
    """The kinds this project prepares and reads, by name: images, and each module beside this one's
    `SHARD_KIND`, by what is present."""
    found = modules_with(__package__, [str(Path(__file__).parent)], "SHARD_KIND")
    return {kind.name: kind for kind in (ImageShards, *(module.SHARD_KIND for module in found
                                                          if hasattr(module, "SHARD_KIND")))}  # fmt: skip


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    """`prepare shards`'s arguments (prepare.py)."""
    kinds = shard_kinds()
    parser.add_argument("source", metavar="SOURCE", help="; ".join(kind.source for kind in kinds.values()))
    parser.add_argument("out", metavar="OUT", help="the folder or store to write (s3://bucket/prefix)")
    parser.add_argument("--kind", choices=list(kinds), required=True, help="what SOURCE holds")
    parser.add_argument("--samples-per-shard", type=int, default=1024, help="samples in each shard file")
    for kind in kinds.values():
        kind.add_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="the shuffle of the samples as they are written")
    parser.set_defaults(prepare=run_prepare)


def run_prepare(args: argparse.Namespace) -> int:
    """`prepare shards`: the shards and the index written, summed up in one line."""
    kinds = shard_kinds()
    least = [("--samples-per-shard", args.samples_per_shard, 1), *(item for kind in kinds.values()
                                                                   for item in kind.least(args))]  # fmt: skip
    for name, value, bound in least:
        if value < bound:
            raise ConfigError(f"{name} must be >= {bound}, got {value}")
    exclude = () if is_remote(args.out) else (Path(args.out.removeprefix("file://")),)  # OUT inside SOURCE
    splits, meta = kinds[args.kind].splits(args, exclude)
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

    def __init__(self, root: str, index: dict[str, Any], split: str, cache: ShardCache | None, window: int,
                 kind: Any) -> None:  # fmt: skip
        self.root, self.cache, self.shard_window, self.kind = root.rstrip("/"), cache, window, kind
        self.root = self.root if cache is not None else self.root.removeprefix("file://")
        self.names = [shard["name"] for shard in index["splits"][split]]
        self.shard_bytes = [shard["bytes"] for shard in index["splits"][split]]
        self.shard_sizes = [shard["samples"] for shard in index["splits"][split]]
        self.starts = list(itertools.accumulate(self.shard_sizes, initial=0))
        self.opened: OrderedDict[int, tuple[int | None, dict[str, torch.Tensor]]] = OrderedDict()
        self.pid = os.getpid()
        self.prepared: dict[str, str] | None = None  # {"root", "id"} of the data set: sharded() sets it

    def sample_order(self, generator: torch.Generator) -> torch.Tensor:
        """An epoch's order that reads few shards at a time (engine/data/sampler.py draws it from (seed, epoch)):
        the shards in a random order, then the samples shuffled within each window of `shard_window`
        consecutive shards of that order. Every rank's next global batches fall in one or two windows, so a
        node needs about `shard_window` shards at a time, not all of them."""
        shards = torch.randperm(len(self.shard_sizes), generator=generator).tolist()
        windows = []
        for begin in range(0, len(shards), self.shard_window):
            indices = torch.cat([torch.arange(self.starts[k], self.starts[k + 1])
                                 for k in shards[begin : begin + self.shard_window]])  # fmt: skip
            windows.append(indices[torch.randperm(len(indices), generator=generator)])
        return torch.cat(windows)

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} of a set of {len(self)}")
        shard = bisect.bisect_right(self.starts, index) - 1
        tensors, row = self.shard(shard), index - self.starts[shard]
        return self.kind.item(tensors, row)

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


def read_index(root: str, kinds: dict[str, Any]) -> dict[str, Any]:
    """OUT/index.json of a prepared data set of one of `kinds`; one line where there is none or it is not one."""
    fs, path = filesystem(root)
    if is_remote(root):
        check_reachable(root, "data.root")
    try:
        index = json.loads(fs.cat_file(f"{path.rstrip('/')}/{INDEX}"))
    except FileNotFoundError:
        raise ConfigError(f"data.root={root} holds no {INDEX}: prepare it first with "
                          f"`{PREPARE_COMMAND} SOURCE {root} --kind {'|'.join(kinds)}`") from None  # fmt: skip
    if index.get("format") != FORMAT or index.get("kind") not in kinds:
        raise ConfigError(f"data.root={root}: {INDEX} is of format {index.get('format')} and kind "
                          f"{index.get('kind')}, this code reads format {FORMAT}: prepare it again")  # fmt: skip
    return index


def sharded(root: str, cache_dir: str = "", cache_limit_gb: float = 10.0, shard_window: int = 4,
            **sizes: int) -> tuple[ShardedSet, ShardedSet]:  # fmt: skip
    """The (train, val) pair of the data set prepared at `root` (a folder or s3://bucket/prefix). A
    store's shards are cached under `cache_dir` ("": the system's temp dir), at most about
    `cache_limit_gb` for this data set on each node; the training order reads `shard_window` shards at a
    time. `sizes` (images: `num_classes`; each kind's `sizes`) must agree with the data set where set."""
    kinds = shard_kinds()
    known = {name for kind in kinds.values() for name in kind.sizes}
    if unknown := sorted(set(sizes) - known):
        raise ConfigError(f"data.dataset.{unknown[0]} is not a setting of data=shards: give one of {sorted(known)}")
    index = read_index(root, kinds)
    if shard_window < 1:
        raise ConfigError(f"data.shard_window must be >= 1, got {shard_window}")
    kinds[index["kind"]].check(root, index, sizes)
    cache = None
    if is_remote(root):
        largest = max(shard["bytes"] for shards in index["splits"].values() for shard in shards)
        if cache_limit_gb * 1e9 < shard_window * largest:
            raise ConfigError(f"data.cache_limit_gb={cache_limit_gb} holds fewer than data.shard_window={shard_window}"
                              f" shards of {largest / 1e6:.3g} MB: raise it to at least "
                              f"{shard_window * largest / 1e9:.3g}")  # fmt: skip
        cache = ShardCache(root, cache_folder(cache_dir, root, index["id"]), int(cache_limit_gb * 1e9))
    train, val = (ShardedSet(root, index, split, cache, shard_window, kinds[index["kind"]]) for split in SPLITS)
    train.prepared = val.prepared = {"root": root, "id": index["id"]}  # new at each prepare: a checkpoint records it
    return train, val


BUILDABLE = (sharded,)  # what a checkpoint's config may build, found by datasets/__init__.py

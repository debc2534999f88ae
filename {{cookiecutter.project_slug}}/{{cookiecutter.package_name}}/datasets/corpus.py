"""The built-in text corpus: windows of bytes of local files (by default the Python standard library's
own sources, which every machine has), read into memory. For a corpus past memory: tokens.py."""

from __future__ import annotations

import glob
import os
import sysconfig
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..common.errors import ConfigError
from .randomness import current_sample, sample_seed

PREPARING = ".prepare-"  # in the name of the hidden folders prepare writes beside OUT (tokens.py)


def stdlib_sources() -> list[Path]:
    """The Python standard library's own .py files (tests and site-packages left out): a text
    corpus every machine has."""
    root = sysconfig.get_paths()["stdlib"]
    return sorted(
        Path(folder) / name
        for folder, _, names in os.walk(root)
        if "site-packages" not in folder and "test" not in folder
        for name in names
        if name.endswith(".py")
    )


def text_files(root: str | None, exclude: tuple[Path, ...] = ()) -> list[Path]:
    """The corpus: a folder (every file below it), a glob pattern, or None for the stdlib's sources;
    never the files of data prepared from it (a token folder, a set of shards, one being written,
    or the folders `exclude` names): prepare's OUT inside CORPUS is not read back as text."""
    if root is None:
        return stdlib_sources()
    if any(char in root for char in "*?["):
        files = sorted(Path(path) for path in glob.glob(root, recursive=True) if Path(path).is_file())
    else:
        folder = Path(root)
        if not folder.is_dir():
            raise ConfigError(f"data.root={root} is neither a folder nor a glob pattern that matches files")
        files = sorted(path for path in folder.rglob("*") if path.is_file())
    excluded = {path.resolve() for path in exclude}
    verdicts: dict[Path, bool] = {}

    def left_out(folder: Path) -> bool:  # the folder, or one above it, is prepared data
        if folder not in verdicts:
            verdicts[folder] = folder.resolve() in excluded or is_prepared(folder) or (
                folder.parent != folder and left_out(folder.parent))  # fmt: skip
        return verdicts[folder]

    return [path for path in files if not left_out(path.parent)]


def is_prepared(folder: Path) -> bool:
    """Whether `folder` holds data prepare wrote: a token folder (meta.json, train.bin, val.bin), a set
    of shards (index.json, train-00000.pt), or a hidden folder prepare is writing or left behind."""
    return (
        (folder.name.startswith(".") and PREPARING in folder.name)
        or all((folder / name).is_file() for name in ("meta.json", "train.bin", "val.bin"))
        or all((folder / name).is_file() for name in ("index.json", "train-00000.pt"))
    )


class TextWindows(Dataset):
    """Windows of block_size + 1 bytes of a corpus: (bytes, the same shifted by one) as int64.

    Training windows start at a random offset drawn from the sample's (seed, epoch, index), so
    each epoch sees `samples` fresh windows; evaluation windows are `samples` evenly spaced
    ones, the same every time.
    """

    def __init__(self, data: torch.Tensor, block_size: int, samples: int, random_offsets: bool) -> None:
        if len(data) < block_size + 2:
            raise ConfigError(f"data.block_size={block_size} is longer than a text split of {len(data)} bytes")
        self.data, self.block_size, self.samples, self.random_offsets = data, block_size, samples, random_offsets

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = len(self.data) - self.block_size - 1
        start = sample_seed(*current_sample()) % starts if self.random_offsets else index * starts // self.samples
        window = self.data[start : start + self.block_size + 1].long()
        return window[:-1], window[1:]


def text(
    root: str | None, block_size: int, train_samples: int, val_samples: int, val_every: int = 10
) -> tuple[TextWindows, TextWindows]:
    """Bytes of local text files; every `val_every`-th file (sorted by path) is validation."""
    files = text_files(root)
    if len(files) < 2:
        raise ConfigError(f"data.root={root}: found {len(files)} file(s); a text corpus needs at least 2")
    splits: tuple[bytearray, bytearray] = (bytearray(), bytearray())
    for number, path in enumerate(files):
        splits[number % val_every == 0].extend(path.read_bytes())
    train, val = (torch.frombuffer(split, dtype=torch.uint8) for split in splits)
    return TextWindows(train, block_size, train_samples, True), TextWindows(val, block_size, val_samples, False)


BUILDABLE = (text,)  # what a checkpoint's config may build, found by datasets/__init__.py

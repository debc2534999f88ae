"""A text corpus as token files that training memory-maps: no rank holds the corpus in memory.

Prepared once (`python -m <package>.datasets.prepare tokens CORPUS OUT`, prepare.py): the corpus that
`data=text` reads, split by file by the same rule, streamed file by file into OUT/train.bin and
OUT/val.bin, with OUT/meta.json saying how, and an id, new at each prepare, that a checkpoint records
(engine/assembly/compatibility.py: a resume on data prepared again is refused). Tokens are bytes by default (a
vocabulary of 256), or a byte-level BPE's ids (`--tokenizer bpe|FILE`, datasets/tokenizer.py); meta.json names
the tokenizer and the dtype. Training (`data=tokens`) draws the same windows as `data=text` does from
the same corpus, read from the map of each file, which each process (and each DataLoader worker) opens
on its first window.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import hashlib
import json
import mmap
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

from ..common.errors import ConfigError, say
from .corpus import PREPARING, TextWindows, text_files
from .tokenizer import chosen, save, write_ids

FORMAT = 1
SPLITS = ("train", "val")
DTYPES = {"uint8": torch.uint8, "uint16": torch.uint16, "int32": torch.int32}  # what a tokenizer's ids may need
STDLIB = "stdlib"  # CORPUS naming the Python standard library's sources (data=text's data.root=null)
PREPARE_COMMAND = f"python -m {__package__}.prepare tokens"
PREPARE_HELP = "a text corpus into memory-mapped token files"  # prepare --help


# --- preparing: a corpus into OUT/{train,val}.bin and OUT/meta.json


def prepare_tokens(
    corpus: str | None, out: Path, val_every: int = 10, repeat: int = 1, force: bool = False,
    tokenizer: str | None = None, vocab_size: int | None = None,
) -> dict:  # fmt: skip
    """Write the token folder `out` from a corpus (text_files' rule: a folder, a glob, None for the
    stdlib's sources; never `out` itself nor other prepared data inside it), `repeat` times over,
    atomically: a hidden folder beside it, renamed at the end (one a killed prepare left is removed
    by the next). An existing `out` is refused unless `force`. `tokenizer`: bytes (None), bpe (trained
    on the training files, `vocab_size` ids) or a tokenizer.json (datasets/tokenizer.py). Returns
    meta.json's contents."""
    if val_every < 2 or repeat < 1:
        raise ConfigError(f"--val-every must be >= 2 and --repeat >= 1, got {val_every} and {repeat}")
    if out.exists() and not force:
        raise ConfigError(f"{out} exists: pass --force to replace it, or give another OUT")
    if corpus is not None and not any(char in corpus for char in "*?[") and not Path(corpus).is_dir():
        raise ConfigError(f"CORPUS {corpus} is not a folder, a glob pattern or '{STDLIB}': give one of those")
    files = text_files(corpus, exclude=(out,))
    if len(files) < 2:
        raise ConfigError(f"corpus {corpus}: found {len(files)} file(s); a text corpus needs at least 2")
    check_splits(corpus, files * repeat, val_every)
    training_files = [path for number, path in enumerate(files) if number % val_every]
    chosen_tokenizer = chosen(tokenizer, vocab_size, training_files)
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in remove_stale_folders(out):
        say(f"removed {stale}, a half-written folder of a prepare that stopped before its end")
    staging, lock = locked_folder(out)
    try:
        if chosen_tokenizer.kind == "bytes":
            counts = write_splits(files, staging, val_every, repeat)
        else:
            counts = write_ids(chosen_tokenizer, files, staging, val_every, repeat)
        meta = {"format": FORMAT, **save(chosen_tokenizer, staging),
                "train_tokens": counts[0], "val_tokens": counts[1], "files": len(files) * repeat,
                "repeat": repeat, "val_every": val_every, "corpus": STDLIB if corpus is None else corpus,
                "id": uuid.uuid4().hex}  # fmt: skip  # new at each prepare: a resume sees the data changed
        (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        replace_folder(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        os.close(lock)
    return meta


def check_splits(corpus: str | None, files: list[Path], val_every: int) -> None:
    """Refuse, before any writing, a corpus whose training or validation split would hold no bytes."""
    sizes = [0, 0]
    for number, path in enumerate(files):
        sizes[number % val_every == 0] += path.stat().st_size
    if not any(sizes):
        raise ConfigError(f"corpus {corpus}: its {len(files)} files are all empty: give a corpus of text")
    for split, size in zip(("training", "validation"), sizes, strict=True):
        if not size:
            raise ConfigError(f"corpus {corpus}: its {split} split (every {val_every}th file by path is validation) "
                              "would hold no bytes: give more non-empty files, or another --val-every")  # fmt: skip


def write_splits(files: list[Path], folder: Path, val_every: int, repeat: int) -> list[int]:
    """Each file's bytes appended to train.bin, or to val.bin for every `val_every`-th one (as
    `text` splits), streamed in pieces of 4 MiB; the files listed `repeat` times over, numbered
    on, as a folder of `repeat` copies of the corpus is read. The bytes written to each split."""
    with open(folder / "train.bin", "wb") as train, open(folder / "val.bin", "wb") as val:
        for number, path in enumerate(files * repeat):
            is_val = number % val_every == 0
            with open(path, "rb") as source:
                shutil.copyfileobj(source, val if is_val else train, 2**22)
        for split in (train, val):
            split.flush()
            os.fsync(split.fileno())
        return [train.tell(), val.tell()]


def replace_folder(staging: Path, out: Path) -> None:
    """`staging` renamed to `out`; an old `out` set aside first and removed once the new one is in place."""
    old, lock = None, None
    if out.exists():
        old, lock = locked_folder(out)
        os.replace(out, old / out.name)
    try:
        os.replace(staging, out)
    except BaseException:
        if old is not None:  # the old folder back in its place
            os.replace(old / out.name, out)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
            os.close(lock)  # type: ignore[arg-type]


def locked_folder(out: Path) -> tuple[Path, int]:
    """A new hidden folder beside `out`, made as any folder is (the umask's mode, not mkdtemp's 0700),
    and a descriptor of it that holds a lock (flock) until closed: while it is held the folder is in
    use; once its prepare has stopped, however it stopped, the kernel lets go and the next prepare
    removes it (remove_stale_folders)."""
    while True:
        folder = out.parent / f".{out.name}{PREPARING}{uuid.uuid4().hex[:8]}"
        try:
            os.mkdir(folder)
            break
        except FileExistsError:
            continue
    lock = os.open(folder, os.O_RDONLY)
    with contextlib.suppress(OSError):  # a file system without flock on folders (some NFS): nothing is
        fcntl.flock(lock, fcntl.LOCK_EX)  # removed there, as no lock can be taken (remove_stale_folders)
    return folder, lock


def remove_stale_folders(out: Path) -> list[Path]:
    """Remove the hidden folders beside `out` of prepares that stopped before their end (killed):
    those whose lock no process holds. The folders removed."""
    removed = []
    for folder in sorted(out.parent.glob(f".{glob.escape(out.name)}{PREPARING}*")):
        try:
            fd = os.open(folder, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: a prepare running now; or a file system without locks: left as it is
            continue
        finally:
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    """`prepare tokens`'s arguments (prepare.py)."""
    parser.add_argument("corpus", metavar="CORPUS", help=f"a folder (every file below it), a glob pattern "
                        f"(quoted), or '{STDLIB}' for the Python standard library's sources")  # fmt: skip
    parser.add_argument("out", metavar="OUT", type=Path, help="the folder to write: train.bin, val.bin, meta.json")
    parser.add_argument("--val-every", type=int, default=10, help="every Nth file (sorted by path) is validation")
    parser.add_argument("--repeat", type=int, default=1, help="the corpus this many times over (benchmarks)")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--tokenizer", default="bytes", help="bytes (the default), bpe (a byte-level BPE trained on "
                        "the training files) or a tokenizer.json to use")  # fmt: skip
    parser.add_argument("--vocab-size", type=int, help="--tokenizer bpe: its number of ids")
    parser.set_defaults(prepare=run_prepare)


def run_prepare(args: argparse.Namespace) -> int:
    """`prepare tokens`: the folder written, and summed up in one line."""
    corpus = None if args.corpus == STDLIB else args.corpus
    meta = prepare_tokens(corpus, args.out, args.val_every, args.repeat, args.force, args.tokenizer, args.vocab_size)
    vocab = "" if meta["tokenizer"] == "bytes" else f" model.vocab_size={meta['vocab_size']}"
    say(f"{args.out}: {meta['train_tokens']:,} training and {meta['val_tokens']:,} validation tokens "
        f"from {meta['files']:,} files; train with data=tokens data.root={args.out}{vocab}")  # fmt: skip
    return 0


# --- training: windows of the memory-mapped files


class TokenWindows(TextWindows):
    """TextWindows (the same windows, drawn by the same rule) over a token file mapped into memory
    rather than read: the map opens on the first window a process asks for and is never pickled,
    so each DataLoader worker maps the file itself and the pages stay the page cache's."""

    def __init__(
        self, path: Path, length: int, dtype: str, block_size: int, samples: int, random_offsets: bool
    ) -> None:
        if length < block_size + 2:
            raise ConfigError(f"data.block_size={block_size} is longer than {path} of {length} tokens")
        self.path, self.length, self.dtype = path, length, dtype
        self.block_size, self.samples, self.random_offsets = block_size, samples, random_offsets
        self.map: mmap.mmap | None = None
        self.mapped: torch.Tensor | None = None
        self.prepared: dict[str, str] | None = None  # {"root", "id"} of the folder: token_windows sets it

    @property
    def data(self) -> torch.Tensor:  # type: ignore[override]
        if self.mapped is None:
            with open(self.path, "rb") as file:  # ACCESS_COPY: a private map; nothing is ever written back
                self.map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
            # Windows are drawn at random: without this, each page fault reads the disk's read_ahead_kb
            # around it (8 MiB on some machines) and maps its neighbours in, and an epoch of a few MB of
            # windows leaves most of a large file resident in the rank (docs/language_model.md).
            self.map.madvise(mmap.MADV_RANDOM)
            self.mapped = torch.frombuffer(self.map, dtype=DTYPES[self.dtype], count=self.length)
        return self.mapped

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "mapped": None, "map": None}


def read_meta(root: str) -> dict[str, Any]:
    """OUT/meta.json, checked against the files beside it: a folder that prepare did not finish is refused."""
    folder = Path(root)
    command = f"{PREPARE_COMMAND} CORPUS {root}"
    if not (folder / "meta.json").is_file():
        raise ConfigError(
            f"data.root={root} is not a token folder (no meta.json): run `{command}` first, or give data.root=<where "
            "it is now> (and task.vocab_from=, the same, where a checkpoint's token folder has moved)"
        )
    try:
        meta = json.loads((folder / "meta.json").read_text())
        itemsize = DTYPES[meta["dtype"]].itemsize
        for split in SPLITS:
            size, expected = (folder / f"{split}.bin").stat().st_size, meta[f"{split}_tokens"] * itemsize
            if size != expected:
                raise ValueError(f"{split}.bin holds {size} bytes, meta.json says {expected}")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"data.root={root} is not a valid token folder ({error}): run `{command} --force` again"
        ) from None
    return meta


def token_windows(
    root: str, block_size: int, train_samples: int, val_samples: int, vocab_size: int | None = None
) -> tuple[TokenWindows, TokenWindows]:
    """The token folder `root` (prepare tokens): the training and validation windows of data=text.
    `vocab_size`, the model's (configs/data/tokens.yaml passes model.vocab_size), must be its tokenizer's."""
    meta = read_meta(root)
    if vocab_size is not None and vocab_size != meta["vocab_size"]:
        raise ConfigError(
            f"model.vocab_size={vocab_size}, but the tokens of data.root={root} have {meta['vocab_size']} ids "
            f"({meta['tokenizer']}, its meta.json): set model.vocab_size={meta['vocab_size']}"
        )
    train, val = (
        TokenWindows(Path(root) / f"{split}.bin", meta[f"{split}_tokens"], meta["dtype"], block_size, samples, random)
        for split, samples, random in (("train", train_samples, True), ("val", val_samples, False))
    )
    train.prepared = val.prepared = {"root": root, "id": prepared_id(meta)}
    return train, val


def prepared_id(meta: dict[str, Any]) -> str:
    """What tells this preparation of a token folder from any other (a checkpoint records it): its
    meta.json's id, new at each prepare; for a folder written before there was one, a hash of its
    meta.json, which holds the files' sizes."""
    return meta.get("id") or hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:32]


BUILDABLE = (token_windows,)  # what a checkpoint's config may build, found by datasets/__init__.py

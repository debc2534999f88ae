"""The tokenizers a token folder (datasets/tokens.py) may be written with: bytes (a vocabulary of 256, no file) or
a byte-level BPE (Hugging Face's `tokenizers`: trained on the corpus offline, or an existing tokenizer.json).

`prepare tokens CORPUS OUT --tokenizer bpe --vocab-size V` trains one on CORPUS's training files;
`--tokenizer FILE` takes a tokenizer.json. Either way the tokenizer is copied to OUT/tokenizer.json and
OUT/meta.json names it, so that training (the model's vocab_size), evaluation (val_bpb: the bytes each token
stands for) and generate.py (its decoding) read the same one. Ids are written as uint8 where the
vocabulary fits (256 ids: a tokenizer.json may be that small), as uint16 where it fits 65,536, else as int32.
"""

from __future__ import annotations

import array
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..common.errors import ConfigError

FILE = "tokenizer.json"  # the tokenizer's name in a token folder
BYTES = 256  # the byte tokenizer's vocabulary


class Tokenizer:
    """Text to ids and back, and the number of bytes each id stands for: bytes, or a tokenizers.Tokenizer."""

    def __init__(self, wrapped: Any = None) -> None:
        self.wrapped = wrapped  # None: bytes

    @property
    def kind(self) -> str:
        return "bytes" if self.wrapped is None else "bpe"

    @property
    def vocab_size(self) -> int:
        return BYTES if self.wrapped is None else self.wrapped.get_vocab_size()

    @property
    def dtype(self) -> str:
        """The narrowest type token files hold its ids in (tokens.py's DTYPES)."""
        return "uint8" if self.vocab_size <= 2**8 else "uint16" if self.vocab_size <= 2**16 else "int32"

    def encode(self, text: str) -> list[int]:
        return list(text.encode()) if self.wrapped is None else self.wrapped.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`; bytes that are not UTF-8 (a character cut by a window) as U+FFFD."""
        if self.wrapped is None:
            return bytes(ids).decode(errors="replace")
        return self.wrapped.decode(ids, skip_special_tokens=False)

    def token_bytes(self) -> list[int]:
        """How many bytes of text each id stands for (val_bpb's denominator): byte-level BPE writes a
        token as one character per byte; a special token stands for none."""
        if self.wrapped is None:
            return [1] * BYTES
        special = {token.content for token in self.wrapped.get_added_tokens_decoder().values() if token.special}
        lengths = [0] * self.vocab_size
        for token, index in self.wrapped.get_vocab().items():
            lengths[index] = 0 if token in special else len(token)
        return lengths


def load(path: Path) -> Tokenizer:
    """A tokenizer.json (one refusal line where it is not one)."""
    from tokenizers import Tokenizer as HFTokenizer

    try:
        return Tokenizer(HFTokenizer.from_file(str(path)))
    except Exception as error:  # tokenizers raises a bare Exception for a file it cannot read
        raise ConfigError(f"{path} is not a tokenizer.json ({str(error).splitlines()[0][:120]}): give one") from None


def train_bpe(files: list[Path], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of `vocab_size` ids trained on `files` (GPT-2's scheme: every byte has an id, so
    any text encodes, and decodes back to itself). Offline: nothing is downloaded."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if not BYTES < vocab_size <= 2**31:
        raise ConfigError(f"--vocab-size {vocab_size}: a byte-level BPE needs more than {BYTES} ids")
    tokenizer = HFTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(texts(files), trainer=trainer, length=len(files))
    return Tokenizer(tokenizer)


def texts(files: list[Path]) -> Iterator[str]:
    for path in files:
        yield read_text(path)


def read_text(path: Path) -> str:
    """A file's text: a BPE tokenizes text, so a file that is not UTF-8 is refused (bytes take any file)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(
            f"{path} is not UTF-8 text, which a BPE tokenizer needs: leave it out of the corpus, or prepare "
            "with the default --tokenizer bytes"
        ) from None


def chosen(spec: str | None, vocab_size: int | None, training_files: list[Path]) -> Tokenizer:
    """`--tokenizer`: bytes (the default), bpe (trained on `training_files`) or a tokenizer.json."""
    if spec in (None, "bytes"):
        if vocab_size is not None:
            raise ConfigError("--vocab-size is the BPE's: give --tokenizer bpe with it, or leave it out")
        return Tokenizer()
    if spec == "bpe":
        if vocab_size is None:
            raise ConfigError("--tokenizer bpe needs --vocab-size V (a few thousand for a corpus of megabytes)")
        return train_bpe(training_files, vocab_size)
    if vocab_size is not None:
        raise ConfigError(f"--vocab-size: the tokenizer {spec} has its own vocabulary; leave it out")
    if not Path(spec).is_file():
        raise ConfigError(f"--tokenizer {spec}: not bytes, bpe, or a tokenizer.json file: give one of those")
    return load(Path(spec))


def write_ids(tokenizer: Tokenizer, files: list[Path], folder: Path, val_every: int, repeat: int) -> list[int]:
    """tokens.py's write_splits for a BPE: each file's ids appended to train.bin, or to val.bin for every
    `val_every`-th one (the same split), in the tokenizer's dtype. The ids written to each split."""
    typecode = {"uint8": "B", "uint16": "H", "int32": "i"}[tokenizer.dtype]  # a tokenizer.json of <= 256 ids: uint8
    counts = [0, 0]
    with open(folder / "train.bin", "wb") as train, open(folder / "val.bin", "wb") as val:
        encoded: dict[Path, bytes] = {}  # --repeat: each file encoded once
        for number, path in enumerate(files * repeat):
            ids = encoded.get(path) or array.array(typecode, tokenizer.encode(read_text(path))).tobytes()
            if repeat > 1:
                encoded[path] = ids
            is_val = number % val_every == 0
            (val if is_val else train).write(ids)
            counts[is_val] += len(ids) // array.array(typecode).itemsize
        for split in (train, val):
            split.flush()
            os.fsync(split.fileno())
    return counts


def save(tokenizer: Tokenizer, folder: Path) -> dict[str, Any]:
    """The tokenizer into a token folder being written: what meta.json records of it."""
    if tokenizer.wrapped is None:
        return {"tokenizer": "bytes", "vocab_size": BYTES, "dtype": "uint8"}
    tokenizer.wrapped.save(str(folder / FILE))
    return {"tokenizer": "bpe", "vocab_size": tokenizer.vocab_size, "dtype": tokenizer.dtype, "tokenizer_file": FILE}


def of_folder(root: str | Path, key: str = "task.vocab_from") -> Tokenizer:
    """The tokenizer a token folder was written with (its meta.json): bytes, or its tokenizer.json. `key`: the
    setting that named the folder, which a refusal names (a checkpoint's folder may have moved since)."""
    folder = Path(root)
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError) as error:
        why = "no meta.json" if isinstance(error, FileNotFoundError) else str(error)
        raise ConfigError(
            f"{key}={folder} is not a token folder ({why}): give {key}=<the OUT of prepare tokens, where it is now>"
        ) from None
    if meta.get("tokenizer", "bytes") == "bytes":
        return Tokenizer()
    return load(folder / meta.get("tokenizer_file", FILE))


def find(spec: str | Path) -> Tokenizer:
    """A token folder's tokenizer, or a tokenizer.json itself (generate.py's `tokenizer=`)."""
    path = Path(spec)
    return of_folder(path, "tokenizer") if path.is_dir() else load(path)

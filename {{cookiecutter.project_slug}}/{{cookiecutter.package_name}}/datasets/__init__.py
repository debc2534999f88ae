"""The built-in data sets, each a `data.dataset._target_` that returns a (train, val) pair.

Items are `(input, target)`. A user's own data set is a function like these in a file of their
own (see the README, "Your own model and data"); the loaders, the resumable sampler and exact
evaluation work for any map-style pair. One module per kind: images.py (synthetic, cifar10,
image_folder), corpus.py (a text corpus read into memory), tokens.py (the same corpus prepared into
token files that training memory-maps); prepare.py, the command that writes such files. collate.py:
pad_sequences, a `data.collate` for inputs of different lengths; pad_windows, for a language
model's windows of different lengths.
"""

from __future__ import annotations

from .collate import pad_sequences, pad_windows
from .corpus import TextWindows, stdlib_sources, text, text_files
from .images import (
    TensorImages,
    check_image_tree,
    cifar10,
    image_folder,
    normalise,
    read_cifar_batches,
    synthetic_images,
)
from .shards import ShardedSet, sharded
from .tokens import TokenWindows, token_windows

# What a checkpoint's config may build (engine/checkpoint/trust.py): a data set of yours here, named by no config
# file, is added to it; anything of the package not listed is refused.
BUILDABLE = (synthetic_images, cifar10, image_folder, text, token_windows, sharded)

__all__ = [
    "TensorImages",
    "TextWindows",
    "check_image_tree",
    "cifar10",
    "image_folder",
    "normalise",
    "pad_sequences",
    "pad_windows",
    "read_cifar_batches",
    "ShardedSet",
    "sharded",
    "stdlib_sources",
    "synthetic_images",
    "text",
    "text_files",
    "token_windows",
    "TokenWindows",
]

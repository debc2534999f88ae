"""The built-in data sets, each a `data.dataset._target_` that returns a (train, val) pair.

Items are `(input, target)`. A user's own data set is a function like these in a file of their
own (see the README, "Your own model and data"); the loaders, the resumable sampler and exact
evaluation work for any map-style pair. One module per kind, each with its `BUILDABLE` tuple, found by
what is present (images.py: synthetic, cifar10, image_folder); a kind of data written once into files has
`add_prepare_arguments` (the command that writes it, where the project has one). collate.py: `data.collate`
functions, for inputs of different lengths.

`datasets.<name>` is any public function or class of those modules (`datasets.synthetic_images`, the name
the configs give): nothing here imports a kind by name, so a project made without one lacks only its file.
"""

from __future__ import annotations

from typing import Any

from ..common.registry import buildable_beside, defined_beside

# What a checkpoint's config may build (engine/checkpoint/trust.py): each module's BUILDABLE (a data set of
# yours in a module here, named by no config file: add it to that module's BUILDABLE); anything of the
# package not listed is refused.
BUILDABLE = buildable_beside(__name__, __path__)


def __getattr__(name: str) -> Any:
    """`datasets.<name>`: a public function or class of a module beside this one."""
    return defined_beside(__name__, __path__, name)

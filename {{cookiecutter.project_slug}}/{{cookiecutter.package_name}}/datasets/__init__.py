"""The built-in data sets, each a `data.dataset._target_` returning a (train, val) pair of `(input, target)`
items; one module per kind, each with its `BUILDABLE`, found by what is present (docs/layout.md). A kind
written once into files has `add_prepare_arguments`. `datasets.<name>` is any public name of those modules:
nothing here names a kind, so a project made without one lacks only its file.
"""

from __future__ import annotations

from typing import Any

from ..common.registry import buildable_beside, defined_beside

# What a checkpoint's config may build (engine/checkpoint/trust.py): each module's BUILDABLE (add yours there).
BUILDABLE = buildable_beside(__name__, __path__)


def __getattr__(name: str) -> Any:
    """`datasets.<name>`: a public function or class of a module beside this one."""
    return defined_beside(__name__, __path__, name)

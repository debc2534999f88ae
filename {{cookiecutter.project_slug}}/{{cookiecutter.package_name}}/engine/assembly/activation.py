"""trainer.activation_checkpointing: the repeated blocks' activations recomputed in the backward (docs/recipe.md).
Applied to the plain model before the strategy spreads it; parameter names do not change."""

from __future__ import annotations

import logging

from torch import nn

from ...common.errors import ConfigError
from ..blocks import find_blocks

log = logging.getLogger(__name__)


def checkpoint_activations(model: nn.Module, block_names: list[str], key: str = "") -> list[nn.Module]:
    """Recompute each block's activations in the backward; the blocks. `key`: the setting naming their classes."""
    from torch.distributed._composable import checkpoint

    blocks = find_blocks(model, block_names, key)
    if not blocks:
        name_them = f"name their classes in {key}=[...], or drop it" if key else "drop it"
        raise ConfigError(
            f"trainer.activation_checkpointing=true, but {type(model).__name__} has no repeated blocks to recompute "
            f"(no ModuleList, no ResNet stages): {name_them}"
        )
    for block in blocks:
        checkpoint(block)
    kinds = ", ".join(sorted({type(block).__name__ for block in blocks}))
    log.info("activation checkpointing: %d blocks (%s) recompute their activations in the backward", len(blocks), kinds)
    return blocks

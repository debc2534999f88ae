"""trainer.activation_checkpointing: the repeated blocks' activations are recomputed in the backward
instead of kept from the forward: less memory for activations, about one more forward of time.

The blocks are engine/blocks.py's: the classes config/strategies.py's BLOCKS key names (where the project
has a sharding strategy, the blocks it shards), else the model's repeated units. Applied to the
plain model before the strategy spreads it; parameter names do not change, so checkpoints with
and without it are interchangeable. The recomputation replays each block's random draws (dropout).
"""

from __future__ import annotations

import logging

from torch import nn

from ...common.errors import ConfigError
from ..blocks import find_blocks

log = logging.getLogger(__name__)


def checkpoint_activations(model: nn.Module, block_names: list[str], key: str = "") -> list[nn.Module]:
    """Recompute each block's activations in the backward (torch's composable checkpoint); the blocks.
    `key`: the setting that names the blocks' classes (`block_names`), where the project has one."""
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

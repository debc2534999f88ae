"""trainer.activation_checkpointing: the repeated blocks' activations are recomputed in the backward
instead of kept from the forward: less memory for activations, about one more forward of time.

The blocks are those fsdp shards one by one (fsdp.blocks, else the model's repeated units:
engine/blocks.py), so the same setting means the same under ddp, fsdp and hsdp. Applied to the
plain model before the strategy spreads it; parameter names do not change, so checkpoints with
and without it are interchangeable. The recomputation replays each block's random draws (dropout).
"""

from __future__ import annotations

import logging

from torch import nn

from ...common.errors import ConfigError
from ..blocks import find_blocks

log = logging.getLogger(__name__)


def checkpoint_activations(model: nn.Module, block_names: list[str]) -> list[nn.Module]:
    """Recompute each block's activations in the backward (torch's composable checkpoint); the blocks."""
    from torch.distributed._composable import checkpoint

    blocks = find_blocks(model, block_names)
    if not blocks:
        raise ConfigError(
            f"trainer.activation_checkpointing=true, but {type(model).__name__} has no repeated blocks to recompute "
            "(no ModuleList, no ResNet stages): name their classes in fsdp.blocks=[...], or drop it"
        )
    for block in blocks:
        checkpoint(block)
    kinds = ", ".join(sorted({type(block).__name__ for block in blocks}))
    log.info("activation checkpointing: %d blocks (%s) recompute their activations in the backward", len(blocks), kinds)
    return blocks

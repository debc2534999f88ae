"""A checkpoint's weights into a plain model, whatever strategy wrote it: a whole `.pt`, or a folder
of shards read whole (eval.py, the export): the one way weights are loaded outside training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from .files import check_format_version, load_checkpoint, restore


def load_weights(path: Path, model: nn.Module, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """A checkpoint's weights into a plain model (eval.py, the export), whatever strategy wrote it:
    a whole `.pt`, or a folder of shards read whole. Its payload (for a folder, all but the tensors),
    loaded here unless given."""
    payload = payload if payload is not None else load_checkpoint(path)
    check_format_version(path, payload)
    if path.is_dir():
        from .sharded import load_weights as load_sharded_weights  # torch.distributed.checkpoint: slow to import

        load_sharded_weights(path, model)
    else:
        restore(model, payload, path)
    return payload

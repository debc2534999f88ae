"""A checkpoint's weights into a plain model, whatever strategy wrote it: the one way weights are loaded outside
training (eval.py, the export); the EMA's parameters where the run kept one (trainer.ema), as validation's were."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from ...common.registry import modules_with
from .files import check_format_version, load_checkpoint, restore, shards_reader


def load_weights(path: Path, model: nn.Module, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """A checkpoint's weights (the EMA's, where it has one) into a plain model; its payload, loaded unless given."""
    payload = payload if payload is not None else load_checkpoint(path)
    check_format_version(path, payload)
    if path.is_dir():
        shards_reader(path).load_weights(path, model)
        return payload
    restore(model, payload, path)
    if payload.get("ema"):
        model.load_state_dict(payload["ema"], strict=False)  # the parameters; the buffers stay the model's
    return payload


def has_ema(path: Path, payload: dict[str, Any]) -> bool:
    """Whether the checkpoint holds an EMA of the weights, which load_weights gives."""
    if path.is_dir():
        return "ema" in shards_reader(path).saved_keys(path)
    return bool(payload.get("ema"))


def weight_formats() -> dict[str, ModuleType]:
    """The weights' formats beside the project's own, by what is present: each a module of this folder with a
    `WEIGHT_FORMAT` name, an `export_to(out, model, saved_config, line)` (export.py's `--format`), and a
    `takes(path)` and `read(path, model)` (model.init_from)."""
    found = modules_with(__package__, [str(Path(__file__).parent)], "WEIGHT_FORMAT")
    return {module.WEIGHT_FORMAT: module for module in found if hasattr(module, "WEIGHT_FORMAT")}

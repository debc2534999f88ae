"""model.init_from: a new run starts from weights (docs/recipe.md, "Fine-tuning from weights"), also a folder
of a format a module of checkpoint/ reads (checkpoint/weights.py). Rank 0 reads it, the others receive it."""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...common.errors import ConfigError
from ...common.placement import DistEnv
from ...common.storage import local_path
from ..checkpoint.files import TRAINER_FILE, NotACheckpoint, load_checkpoint, shards_reader
from ..checkpoint.trust import check_trusted, saved_config
from ..checkpoint.weights import weight_formats
from ..distributed.process_group import broadcast_bytes, is_distributed

log = logging.getLogger(__name__)
SHOWN = 4  # names per kind in the one line


def read_weights(path: Path, trust: bool = False, model: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """The model weights a file or a folder of shards holds, as whole CPU tensors; a checkpoint's config by the
    trust rule (checkpoint/trust.py). A folder of another format is checked against `model` by its reader."""
    if not path.exists():
        raise ConfigError(f"model.init_from={path}: no such file or folder; give a weights file or a run's checkpoint")
    for form in weight_formats().values() if model is not None else ():  # another format's folder
        if form.takes(path):
            return form.read(path, model)
    if path.is_dir():
        if (path / TRAINER_FILE).is_file() and not trust:  # the folder's config, in its trainer.pt
            try:
                check_trusted(saved_config(load_checkpoint(path / TRAINER_FILE)), trust, "trust_checkpoint=true")
            except NotACheckpoint as error:
                raise ConfigError(f"model.init_from: {error}") from None
        reader = shards_reader(path)
        try:
            whole = reader.read_whole(path)
            return with_average(whole["model"], whole.get("ema"), path)
        except Exception as error:
            raise ConfigError(f"model.init_from={path}: not a folder of shards that loads ({error})"[:300]) from None
    try:
        if path.suffix == ".safetensors":  # tensors only, nothing to unpickle
            from safetensors.torch import load_file

            payload: Any = load_file(path, device="cpu")
        else:
            payload = torch.load(path, "cpu", weights_only=True)
    except Exception as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:120]
        raise ConfigError(f"model.init_from={path} does not load as tensors and plain values ({first})") from None
    if isinstance(payload, dict) and "config" in payload and not trust:  # a run's checkpoint
        check_trusted(saved_config(payload), trust, "trust_checkpoint=true")
    if isinstance(payload, dict) and isinstance(payload.get("model"), dict) and payload.get("ema"):
        payload = {"model": with_average(payload["model"], payload["ema"], path)}
    for key in ("model", "state_dict"):  # a run's checkpoint; a Lightning-style file
        if isinstance(payload, dict) and isinstance(payload.get(key), dict):
            payload = payload[key]
    if not isinstance(payload, dict) or not any(isinstance(v, torch.Tensor) for v in payload.values()):
        raise ConfigError(f"model.init_from={path} holds no state_dict (names to tensors): give a weights file")
    return {unwrapped(name): value for name, value in payload.items() if isinstance(value, torch.Tensor)}


def with_average(weights: dict[str, torch.Tensor], average: dict | None, path: Path) -> dict[str, torch.Tensor]:
    """The EMA's parameters over the weights where the run kept one (trainer.ema), as its validation used."""
    if not average:
        return weights
    log.info("model.init_from=%s kept an EMA of its weights (trainer.ema): the average is taken, as its "
             "validation, eval.py and the export use it", path)  # fmt: skip
    return {**weights, **average}


def unwrapped(name: str) -> str:
    for prefix in ("module.", "_orig_mod."):  # DDP's wrapper, torch.compile's
        while name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def fit_weights(model: nn.Module, weights: dict[str, torch.Tensor]) -> str:
    """Load what fits into the model; one line saying what was loaded and what was not."""
    live = model.state_dict()
    fitting = {name: value for name, value in weights.items() if name in live and live[name].shape == value.shape}
    reshaped = [f"{name} {list(weights[name].shape)}->{list(live[name].shape)}" for name in live
                if name in weights and name not in fitting]  # fmt: skip
    fresh = [name for name in live if name not in weights]
    unused = [name for name in weights if name not in live]
    parameters = {name for name, _ in model.named_parameters()}
    if fitting and not parameters & fitting.keys():  # BatchNorm's counters alone: nothing learnt would load
        raise ConfigError(
            f"model.init_from: of its {len(weights)} tensors only buffers fit this model ("
            f"{', '.join(list(fitting)[:SHOWN])}), no weight: give weights of this model"
        )
    if not fitting:
        raise ConfigError(
            f"model.init_from: none of its {len(weights)} tensors fits this model (its names: "
            f"{', '.join(list(weights)[:SHOWN])}): give weights of this model"
        )
    model.load_state_dict(fitting, strict=False)
    parts = [f"{len(fitting)} of {len(live)} tensors loaded"]
    for label, names in (("skipped, shape differs", reshaped), ("not in the file, initialised afresh", fresh),
                         ("in the file, not in the model", unused)):  # fmt: skip
        if names:
            more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
            parts.append(f"{label}: {', '.join(names[:SHOWN])}{more}")
    return "; ".join(parts)


def initialise_from(model: nn.Module, source: str, env: DistEnv, has_checkpoint: bool, trust: bool = False) -> None:
    """model.init_from into the plain model on every rank, unless rank 0 sees the run's own checkpoint (the
    resume loads it). A file that does not load is every rank's ConfigError: the others would wait for it."""
    data = b""
    if env.is_main and not has_checkpoint:
        try:
            buffer = io.BytesIO()
            torch.save(read_weights(Path(local_path(source, "model.init_from")), trust, model), buffer)
            data = b"W" + buffer.getvalue()
        except ConfigError as error:
            data = b"E" + str(error).encode()
    if is_distributed():
        data = broadcast_bytes(data, 0, env.device)
    if not data:
        log.info("model.init_from is not read: the run resumes its own checkpoint")
        return
    if data[:1] == b"E":
        raise ConfigError(data[1:].decode())
    weights = torch.load(io.BytesIO(data[1:]), map_location="cpu", weights_only=True)
    log.info("initialised from %s: %s", source, fit_weights(model, weights))

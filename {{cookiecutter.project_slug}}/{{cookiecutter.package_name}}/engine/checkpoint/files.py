"""A checkpoint's files: written atomically, found, loaded (weights_only: a checkpoint cannot run code) and set
aside; what goes into one: manager.py. The format and its promises: docs/checkpoints.md ("Writing")."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

import torch
from torch import nn

from ...common.errors import ConfigError
from ...common.run_dir import CHECKPOINTS_DIR, OUTPUT_ROOT
from ...common.storage import is_remote, store_module
from ...config import CheckpointConfig

FORMAT_VERSION = 1  # what this code writes; a checkpoint of a newer one is refused (check_format_version)
NAME_PATTERN = re.compile(r"^step_(\d+)(\.pt)?$")  # a file (ddp) or a folder of shards
TMP_PREFIX = ".tmp_"
TRAINER_FILE, METADATA_FILE = "trainer.pt", ".metadata"  # in a folder of shards: all but the tensors; DCP's
BEST_FILE = "best.json"  # checkpoint.keep_best's checkpoints, best first (writer.py)
OWNER_FILE = ".owner"  # in a checkpoint.dir (a folder or a store's prefix): the run dir of the run it belongs to


def shards_reader(path: Path) -> ModuleType:
    """sharded.py, which reads a folder of shards, imported at first use (1.7 s); one line where this project
    was made without it."""
    name = f"{__package__}.sharded"
    if importlib.util.find_spec(name) is None:
        raise ConfigError(
            f"{path} is a folder of shards, and this project was made without the strategies that read them: "
            "export its weights to one file with the project that wrote it (python -m "
            f"{__package__.split('.')[0]}.export {path} weights.pt) and give that file as model.init_from"
        )
    return importlib.import_module(name)


def checkpoint_store(config: CheckpointConfig, folder: Path) -> Any:
    """The store `checkpoint.dir` names (store.py's CheckpointStore), None for a folder; one line where this project
    has no store."""
    if not is_remote(config.dir):
        return None
    store_module(config.dir, "checkpoint.dir")
    return importlib.import_module(f"{__package__}.store").CheckpointStore.for_config(config, folder)


def with_owner_tensors(payload: dict[str, Any], source: Path, owners: list[Any]) -> dict[str, Any]:
    """The payload the owners (the EMA) load from: a folder of shards' trainer.pt gets their tensors read in."""
    if "model" in payload:
        return payload
    return {**payload, **shards_reader(source).load_owner_tensors(source, owners)}


def local_folder(run_dir: Path, config: CheckpointConfig) -> Path:
    """Where this machine writes the checkpoints: `checkpoint.dir` where it is a folder, else the run dir's
    checkpoints/."""
    return Path(config.dir) if config.dir and not is_remote(config.dir) else run_dir / CHECKPOINTS_DIR


def owner_id(run_dir: Path) -> str:
    """A run's name in an OWNER_FILE: its run dir relative to the working dir (the same on every machine, so a
    relaunched job matches) where it lies below it, else absolute."""
    absolute = Path(os.path.abspath(run_dir))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def step_of(name: str) -> int:
    return int(NAME_PATTERN.match(name).group(1))  # type: ignore[union-attr]


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}.pt"


def to_cpu(value: Any) -> Any:
    """A deep copy of a nested state, every tensor copied to CPU memory."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(item) for item in value)
    return value


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(
    payload: Any, path: Path, save: Callable[[Any, BinaryIO], Any] = torch.save, folder: bool = True
) -> None:
    """`save` to a temporary file beside `path`, fsync, rename into place; then fsync the folder if `folder`."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    try:
        with open(tmp, "wb") as file:
            save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if folder:
        fsync_dir(path.parent)


def write_text_atomically(text: str, path: Path) -> None:
    """A small text file (best.json) replaced whole or not at all."""
    write_atomically(text.encode(), path, lambda data, file: file.write(data), folder=False)


def best_checkpoint(given: Path) -> Path:
    """The first checkpoint of best.json (checkpoint.keep_best) that is there, for `<run dir>/best`,
    `<run dir>/checkpoints/best` or a bare `best` (the newest run's under outputs/)."""
    if str(given) == "best":
        listings = sorted(Path(OUTPUT_ROOT).glob(f"**/{BEST_FILE}"), key=lambda path: path.stat().st_mtime)
        if not listings:
            raise ConfigError(
                f"best: no run under {OUTPUT_ROOT}/ kept best checkpoints (checkpoint.keep_best): give "
                "<run dir>/checkpoints/best, or a step_<N>.pt path"
            )
        given = listings[-1].parent / "best"
    folder = given.parent if given.name == "best" else given
    for where in (folder, folder / CHECKPOINTS_DIR):
        listing = where / BEST_FILE
        if listing.is_file():
            for name in json.loads(listing.read_text())["best"]:
                if (where / name).exists():
                    return where / name
            raise ConfigError(f"{listing} names no checkpoint that is there (pruned, or not written yet)")
    raise ConfigError(
        f"{given}: no {BEST_FILE} in {folder} or {folder / CHECKPOINTS_DIR}: the run kept no best checkpoints "
        "(train with checkpoint.keep_best=1 or more), or give a step_<N>.pt path"
    )


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def list_checkpoints(folder: Path) -> list[Path]:
    """Checkpoints in the folder, newest (highest step) first."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := NAME_PATTERN.match(p.name))]
    return [path for _, path in sorted(found, reverse=True)]


class NotACheckpoint(ValueError):
    """A file that does not load as one of this project's checkpoints (tensors and plain values)."""


def load_checkpoint(path: Path | str) -> dict[str, Any]:
    """A checkpoint loaded with weights_only onto the CPU (a folder of shards': its trainer.pt), else a
    NotACheckpoint in one line."""
    path = Path(path)
    if path.is_dir():
        for name in (METADATA_FILE, TRAINER_FILE):
            if not (path / name).is_file():
                raise NotACheckpoint(f"{path} has no {name}: not a complete sharded checkpoint")
        return load_checkpoint(path / TRAINER_FILE)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        if "weights_only" in str(error):  # torch's message advises turning weights_only off: never repeat that
            raise NotACheckpoint(
                f"{path} holds objects other than tensors and plain values: not a checkpoint of this project"
            ) from None
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:120]
        raise NotACheckpoint(f"{path} is unreadable ({first}): not a checkpoint of this project") from None
    whole = path.name != TRAINER_FILE  # a ddp checkpoint; a folder's trainer.pt has no tensors
    if not isinstance(payload, dict) or "step" not in payload or (whole and "model" not in payload):
        raise NotACheckpoint(f"{path} is not a checkpoint of this project (no 'model' or 'step')")
    return payload


def check_format_version(path: Path | str, payload: dict[str, Any]) -> None:
    """Refuse a checkpoint written by newer code, which this code may misread."""
    version = payload.get("format_version", FORMAT_VERSION)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ConfigError(
            f"checkpoint {path} has format version {version}, newer than this code's {FORMAT_VERSION}: "
            "update the project's code to the version that wrote it, or start a new run dir"
        )


def restore(model: nn.Module, payload: dict[str, Any], path: Path) -> None:
    """The model weights loaded; a shape or key mismatch in one line."""
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as error:
        first = str(error).strip().splitlines()
        raise ConfigError(f"checkpoint {path} does not fit this model: {' '.join(first[:3])[:300]}") from None

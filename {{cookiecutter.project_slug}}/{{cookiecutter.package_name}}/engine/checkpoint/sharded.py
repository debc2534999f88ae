"""Sharded checkpoints (strategy=fsdp): torch.distributed.checkpoint (DCP), each rank writing its part.

- `<run dir>/checkpoints/step_<N>/` holds DCP's files (one `__<rank>_0.distcp` per rank, and
  `.metadata`, written last) and `trainer.pt`: rank 0's plain state (position, generator
  states, config), as in a ddp checkpoint less the model and the optimizer.
- Each rank copies its shards to CPU memory on the training thread (the hold), then DCP writes
  them in the background over a process group of its own, into `.tmp_step_<N>/`. Once every
  rank has written and the metadata is down, rank 0 adds `trainer.pt` and renames the folder
  into place: after a kill at any instant a step's checkpoint is complete or absent.
- Loading reshards: a checkpoint of N ranks resumes on M. A ddp checkpoint (`step_<N>.pt`)
  loads under fsdp, and a sharded one under ddp. DCP's own loader unpickles its metadata and
  non-tensor values freely; here the metadata is read by an unpickler that knows DCP's record
  classes only, and the other values with `torch.load(..., weights_only=True)`.
"""

from __future__ import annotations

import io
import os
import pickle
import threading
import time
import warnings
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem

from ...common.errors import first_line
from ...config import CheckpointConfig
from .files import METADATA_FILE, TMP_PREFIX, TRAINER_FILE, NotACheckpoint, fsync_dir, write_atomically
from .writer import Checkpointer

TENSOR_KEYS = ("model", "optimizer", "ema")  # DCP's part of a trainer's state; the rest goes to trainer.pt


def sharded_name(step: int) -> str:
    return f"step_{step:08d}"


class MetadataUnpickler(pickle.Unpickler):
    """DCP's `.metadata` holds its own dataclasses, torch sizes, dtypes and paths: those only."""

    MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")

    def find_class(self, module: str, name: str) -> Any:
        if module in self.MODULES and not name.startswith("__"):
            found = super().find_class(module, name)  # a dotted name reaches what the module imports: os.system
            if isinstance(found, type) and found.__module__ == module:  # so DCP's own record classes only
                return found
        if (module, name) in {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
                              ("pathlib", "PurePosixPath"), ("collections", "OrderedDict")}:  # fmt: skip
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype | torch.memory_format):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def read_metadata(folder: Path) -> Any:
    """A folder's `.metadata`; a NotACheckpoint with one line where it does not load: read before DCP is
    asked, whose failure is a BaseException with a traceback per attempt (and `except Exception` misses it)."""
    try:
        with open(folder / METADATA_FILE, "rb") as file:
            return MetadataUnpickler(file).load()
    except Exception as error:
        raise NotACheckpoint(f"its {METADATA_FILE} does not load: {first_line(error)}") from None


def dcp_failure(error: BaseException) -> str:
    """DCP's CheckpointException (every rank's failure, each with its traceback) as one line: the first's."""
    failures = getattr(error, "failures", None)
    for item in failures.values() if isinstance(failures, dict) else ():
        found = item[0] if isinstance(item, tuple) else item
        if isinstance(found, BaseException):
            return first_line(found)
    return first_line(error)


class SafeReader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        with open(Path(self.path) / METADATA_FILE, "rb") as file:
            metadata = MetadataUnpickler(file).load()
        if getattr(metadata, "storage_meta", None) is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoading:
    """Non-tensor values (the optimizer's settings) load as plain values only."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:  # type: ignore[attr-defined]
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)  # type: ignore[attr-defined]
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded  # type: ignore[attr-defined]


class SafePlanner(SafeLoading, DefaultLoadPlanner):
    pass


class SafeWholePlanner(SafeLoading, _EmptyStateDictLoadPlanner):
    pass


def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Model and optimizer state keyed by parameter names, each tensor as it lives: this rank's
    shards under fsdp, whole tensors otherwise. What DCP saves and loads into."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}


def load_sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """The inverse of sharded_state()."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, Any],
                    optimizer_state: dict[str, Any]) -> None:  # fmt: skip
    """A ddp checkpoint's whole model and optimizer state (the optimizer's keyed by parameter
    number, as torch.optim saves it) into a sharded model: each rank keeps its shards."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, weights, options=options)
    names = {parameter: name for name, parameter in model.named_parameters()}
    order = [names[parameter] for group in optimizer.param_groups for parameter in group["params"]]
    by_name: dict[str, Any] = {
        "state": {order[number]: state for number, state in optimizer_state["state"].items()},
        "param_groups": [
            {**group, "params": [order[number] for number in group["params"]]}
            for group in optimizer_state["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=options)


def load_into(path: Path, state: dict[str, Any]) -> None:
    """Fill `state`'s tensors (shards or whole tensors) from the checkpoint folder, resharding as
    needed (a collective when a process group exists; every rank reads what it needs)."""
    import torch.distributed.checkpoint as dcp

    alone = not dist.is_initialized()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")  # one process: meant
        dcp.load(state, storage_reader=SafeReader(path), planner=SafePlanner(), no_dist=alone)


def read_whole(path: Path) -> dict[str, Any]:
    """Everything a sharded checkpoint's shards hold, as whole tensors, in one process:
    {"model": {name: tensor}, "optimizer": {"state": ..., "param_groups": ...}}."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict  # dcp.load keeps {} empty

    read_metadata(path)
    state: dict[str, Any] = {}
    try:
        _load_state_dict(state, storage_reader=SafeReader(path), planner=SafeWholePlanner(), no_dist=True)
    except CheckpointException as error:  # a shard missing or cut short
        raise NotACheckpoint(f"its shards do not load: {dcp_failure(error)}") from None
    return state


def load_sharded(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """A sharded checkpoint's model and optimizer state into the live (sharded or plain) ones."""
    state = sharded_state(model, optimizer)
    load_into(path, state)
    load_sharded_state(model, optimizer, state)


def load_weights(path: Path, model: nn.Module) -> None:
    """Only the model's weights, into a plain model (eval.py, the export); the EMA's parameters where
    the folder holds them."""
    state: dict[str, Any] = {"model": model.state_dict()}
    averaged = "ema" in saved_keys(path)
    if averaged:
        state["ema"] = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    load_into(path, state)
    model.load_state_dict(state["model"])
    if averaged:
        model.load_state_dict(state["ema"], strict=False)


def saved_keys(folder: Path) -> set[str]:
    """The top-level keys a folder's shards hold (model, optimizer, and ema where trainer.ema was on)."""
    return {name.split(".", 1)[0] for name in read_metadata(folder).state_dict_metadata}


def load_owner_tensors(folder: Path, owners: list[Any]) -> dict[str, Any]:
    """The owners' tensors (beyond the model's and the optimizer's) a folder of shards holds, read into
    the owners' live tensors: {key: those tensors}, for the owners' load_state_dict. A key the folder
    lacks (a run without the EMA) is left out."""
    there = saved_keys(folder)
    state = {key: value for owner in owners for key, value in owner.state_dict().items()
             if key in TENSOR_KEYS and key in there and value}  # fmt: skip
    if state:
        load_into(folder, state)
    return state


def shard_files(folder: Path) -> list[str]:
    """The shard files a folder's `.metadata` names: those of every rank."""
    return sorted({info.relative_path for info in read_metadata(folder).storage_data.values()})


class ShardedCheckpointer(Checkpointer):
    """Saves with every rank in the background; rank 0 commits. Finding and pruning as the base."""

    def __init__(self, folder: Path, config: CheckpointConfig, is_writer: bool) -> None:
        super().__init__(folder, config, is_writer, fetches=True)  # every rank reads its part of a resume
        # DCP's collectives in the background must not interleave with training's: their own group (of all ranks).
        self._group = cast(dist.ProcessGroup, dist.new_group(backend="gloo")) if dist.is_initialized() else None
        self._future: Any = None
        if dist.is_initialized():
            dist.barrier()  # the folder exists and the leftovers are gone before anyone writes

    def name_of(self, step: int) -> str:
        return sharded_name(step)

    def holds_every_shard(self, path: Path) -> bool:
        """Whether a folder holds every rank's shard file its metadata names (without a shared disk, a node
        holds only its own ranks' shards)."""
        try:
            return all((path / name).is_file() for name in shard_files(path))
        except Exception:  # no metadata, or unreadable: not whole here
            return False

    def save(self, step: int, state: dict[str, Any]) -> bool:
        """Every rank: copy its shards now, write them in the background; rank 0 then commits."""
        import torch.distributed.checkpoint as dcp

        if self.last_saved_step == step:
            return False
        self.wait()
        tensors = {key: state[key] for key in TENSOR_KEYS if state.get(key)}
        plain = {key: value for key, value in state.items() if key not in TENSOR_KEYS}
        tmp = self.folder / f"{TMP_PREFIX}{sharded_name(step)}"
        final = self.folder / sharded_name(step)
        self._writing = final
        self._future = dcp.async_save(tensors, storage_writer=FileSystemWriter(tmp), process_group=self._group)
        self._thread = threading.Thread(target=self._commit, args=(plain, tmp, final, step), name="checkpoint-commit")
        self._thread.start()
        self.last_saved_step = step
        return True

    def _commit(self, plain: dict[str, Any], tmp: Path, final: Path, step: int) -> None:
        try:
            started = time.perf_counter()
            self._future.result()  # every rank's shards and then the metadata are written
            if self.store is not None:  # each rank sends its own shards up (no file system is shared)
                rank = dist.get_rank() if dist.is_initialized() else 0
                mine = [name for name in os.listdir(tmp) if name.startswith(f"__{rank}_")]
                self.store.upload(tmp, final.name, [*mine, *([METADATA_FILE] if self.is_writer else [])])
            if not self.is_writer:
                return
            write_atomically(plain, tmp / TRAINER_FILE)
            if self.store is not None:  # trainer.pt last, once every rank's shards are there: whole
                self.store.wait_for(final.name, shard_files(tmp))
                self.store.upload(tmp, final.name, [TRAINER_FILE])
            self.set_aside(final)  # one found unreadable and resumed past: renamed, not replaced
            os.replace(tmp, final)
            fsync_dir(self.folder)
            self._written(final, step, started, upload=False)
        except BaseException as error:  # re-raised on the training thread by wait()
            self._error = error

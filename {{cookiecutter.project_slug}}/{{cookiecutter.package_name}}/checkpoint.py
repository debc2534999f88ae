"""What goes into a checkpoint, how it is written safely, and which one a run resumes from.

- Global rank 0 writes `<run dir>/checkpoints/step_<N>.pt`, N the global optimizer step
  (strategy=ddp; strategy=fsdp writes a folder `step_<N>/` of shards: sharded_checkpoint.py).
- The state is copied to CPU memory on the training thread (the only part that holds a step
  up); a background thread writes it to a temporary file in the same folder, fsyncs it,
  renames it into place and fsyncs the folder, so a kill at any instant leaves either the
  complete new file or none, and never touches the previous one.
- Only tensors and plain Python values are stored, and files are loaded with
  `torch.load(..., weights_only=True)`: a checkpoint cannot run code when it is loaded.
"""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import nn

from .compatibility import check_resumable
from .config import CheckpointConfig, ConfigError, JobError, first_line
from .distributed import DistEnv, all_gather_int, broadcast_bytes

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
NAME_PATTERN = re.compile(r"^step_(\d+)(\.pt)?$")  # a file (ddp) or a folder of shards (fsdp)
TMP_PREFIX = ".tmp_"
TRAINER_FILE, METADATA_FILE = "trainer.pt", ".metadata"  # in a folder of shards: all but the tensors; DCP's


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}.pt"


@dataclass
class TrainState:
    """Where training stands: enough, with model and optimizer, to continue bit-exactly."""

    epoch: int = 0
    step: int = 0  # global optimizer steps taken
    samples_in_epoch: int = 0  # samples of `epoch`'s order already trained on, over all ranks


def to_cpu(value: Any) -> Any:
    """A deep copy of a (nested) state with every tensor copied to CPU memory."""
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


def write_atomically(payload: dict[str, Any], path: Path) -> None:
    """torch.save to a temporary file beside `path`, fsync, rename into place, fsync the folder."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    try:
        with open(tmp, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


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
    """Load a checkpoint safely (weights_only) onto the CPU; anything else is a NotACheckpoint
    with a one-line reason (never torch's advice to turn weights_only off: a file that
    needs it could run code). A folder of shards answers with its trainer.pt: all but the tensors."""
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


class Checkpointer:
    """Saves on global rank 0 in the background and finds the checkpoint to resume from."""

    def __init__(self, folder: Path, config: CheckpointConfig, is_writer: bool) -> None:
        self.folder = folder
        self.config = config
        self.is_writer = is_writer
        self.last_saved_step: int | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._valid: set[Path] = set()  # checkpoints known to load
        self._writing: Path | None = None
        # Called by the writer thread with the step of each checkpoint once it is on disk; they must not raise.
        self.on_written: list[Callable[[int], None]] = []
        if is_writer:
            folder.mkdir(parents=True, exist_ok=True)
            for leftover in folder.glob(f"{TMP_PREFIX}*"):  # from a writer killed mid-write
                remove(leftover)

    def save_config(self, plain_config: dict[str, Any]) -> None:
        """The resolved config beside the checkpoints, as YAML."""
        if self.is_writer:
            (self.folder / "config.yaml").write_text(OmegaConf.to_yaml(plain_config))

    def save(self, step: int, state: dict[str, Any]) -> bool:
        """Snapshot `state` (a trainer's state_dict) now and write it in the background as step `step`.

        Every rank may call this; only the writer does anything. A second save at the same step
        (the one resumed from, too) is skipped, and a save waits for the one before it. True when
        a save was started.
        """
        if not self.is_writer or self.last_saved_step == step:
            return False
        self.wait()
        payload = to_cpu(state)
        path = self._writing = self.folder / checkpoint_name(step)
        self._thread = threading.Thread(target=self._write, args=(payload, path, step), name="checkpoint-writer")
        self._thread.start()
        self.last_saved_step = step
        return True

    def _write(self, payload: dict[str, Any], path: Path, step: int) -> None:
        try:
            started = time.perf_counter()
            write_atomically(payload, path)
            self._written(path, step, started)
        except BaseException as error:  # re-raised on the training thread by wait()
            self._error = error

    def _written(self, path: Path, step: int, started: float) -> None:
        """On the writer thread, once a checkpoint is complete under its name: count it, tell the
        callbacks, prune."""
        self._valid.add(path)
        log.info("saved checkpoint %s (written in %.2f s)", path, time.perf_counter() - started)
        for callback in self.on_written:
            callback(step)
        self.prune()

    def prune(self) -> None:
        """Keep the newest `keep_last` valid checkpoints. A file that is not one (unreadable, cut
        short, foreign) is set aside under another name with a warning and never counted, so it
        can never push a good checkpoint out."""
        valid = []
        for path in list_checkpoints(self.folder):
            if path not in self._valid:
                try:
                    if path.is_dir():
                        load_checkpoint(path)
                    else:
                        probe = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
                        if not (isinstance(probe, dict) and {"model", "step"} <= probe.keys()):
                            raise NotACheckpoint("no 'model' or 'step'")
                except Exception as error:
                    aside = path.with_name(f"{path.name}.unreadable")
                    os.replace(path, aside)
                    log.warning("%s is not a valid checkpoint (%s): set aside as %s", path, str(error)[:80], aside.name)
                    continue
                self._valid.add(path)
            valid.append(path)
        for old in valid[self.config.keep_last :]:
            remove(old)
            self._valid.discard(old)

    def set_aside(self, path: Path) -> None:
        """A checkpoint that failed to load: out of the way (by the writer), never tried again."""
        if self.is_writer and path.exists():
            os.replace(path, path.with_name(f"{path.name}.unreadable"))
        self._valid.discard(path)

    def raise_if_failed(self) -> None:
        """Without waiting: stop with the background write's error if it has failed."""
        if self._error is not None:
            self.wait()

    def wait(self) -> None:
        """Block until the background write (if any) is on disk; its failure is a JobError."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise JobError(
                f"writing checkpoint {self._writing} failed ({first_line(error)}); the previous checkpoints are "
                "intact: free some space or fix the run dir's permissions, then launch again"
            ) from error

    def find_resume_payload(self, skip: frozenset[Path] = frozenset()) -> tuple[Path, dict[str, Any]] | None:
        """The checkpoint to resume from per checkpoint.resume, loaded; None to start afresh.
        `skip`: checkpoints that failed to load (a corrupt shard).

        With a path, the run dir's own checkpoints win once there are any: a torchrun restart
        must continue the job, not go back to where it started.
        """
        resume = self.config.resume
        if resume == "never":
            return None
        found = self.newest_readable(skip)
        if resume != "auto" and found is None:
            path = Path(resume)
            if not path.exists():
                raise ConfigError(
                    f"checkpoint.resume={resume}: no such file; give a step_<N>.pt (or step_<N>/) path, auto or never"
                )
            try:
                found = path, load_checkpoint(path)
            except NotACheckpoint as error:
                raise ConfigError(
                    f"checkpoint.resume={resume}: {error}; give a checkpoints/step_<N>.pt of a run"
                ) from None
        if found is not None:
            self.last_saved_step = found[1]["step"]  # resuming from it: no need to write it again
        return found

    def newest_readable(self, skip: frozenset[Path] = frozenset()) -> tuple[Path, dict[str, Any]] | None:
        for path in list_checkpoints(self.folder):
            if path in skip:
                continue
            try:
                return path, load_checkpoint(path)
            except Exception as error:  # truncated or corrupt: fall back to the next older one
                log.warning("skipping unreadable checkpoint %s (%s); trying an older one", path, error)
        return None

    def refuse_to_overwrite(self) -> None:
        """checkpoint.resume=never must not write over a run's checkpoints: refuse at launch."""
        existing = list_checkpoints(self.folder)
        if self.config.resume == "never" and existing:
            raise ConfigError(
                f"checkpoint.resume=never but {self.folder} already holds checkpoints ({existing[0].name}); "
                "start a new run dir (leave RUN_DIR out) or use checkpoint.resume=auto to continue it"
            )


def check_format_version(path: Path | str, payload: dict[str, Any]) -> None:
    """Refuse a checkpoint written by newer code, whose contents this code may misread."""
    version = payload.get("format_version", FORMAT_VERSION)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ConfigError(
            f"checkpoint {path} has format version {version}, newer than this code's {FORMAT_VERSION}: "
            "update the project's code to the version that wrote it, or start a new run dir"
        )


def find_compatible_checkpoint(
    checkpoints: Checkpointer, config: dict[str, Any], epochs: int
) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to resume from, refused with a clear message if resuming it under `config`
    would break a promise (compatibility.py)."""
    found = checkpoints.find_resume_payload()
    if found is not None:
        path, payload = found
        check_format_version(path, payload)
        check_resumable(path, payload, config, epochs)
    return found


def agree_on_checkpoint(found: tuple[Path, dict[str, Any]] | None, env: DistEnv) -> tuple[Path, dict[str, Any]] | None:
    """Make every rank resume from the newest checkpoint that any rank holds.

    On a shared filesystem all ranks found the same file. Without one, only the nodes that
    wrote checkpoints hold them: the newest is sent, through the process group, to the ranks
    that lack it, so a job whose node 0 was replaced still resumes.
    """
    steps = all_gather_int(found[1]["step"] if found else -1, env.device)
    newest = max(steps)
    if newest < 0 or all(step == newest for step in steps):
        return found
    source = steps.index(newest)
    data = broadcast_bytes(found[0].read_bytes() if env.rank == source and found and found[0].is_file() else None,
                           source, env.device)  # fmt: skip
    if not data:  # a folder of shards: every rank must read its own part of it
        raise JobError(
            f"only some nodes see the sharded checkpoint of step {newest}: strategy=fsdp needs the run dir on a "
            "filesystem every node shares"
        )
    if found is not None and found[1]["step"] == newest:
        return found
    log.info("rank %d holds no checkpoint of step %d; received it from rank %d", env.rank, newest, source)
    payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    return Path(f"rank{source}:{checkpoint_name(newest)}"), payload


def restore(model: nn.Module, payload: dict[str, Any], path: Path) -> None:
    """Load the model weights, turning a shape or key mismatch into a one-line error."""
    check_format_version(path, payload)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as error:
        first = str(error).strip().splitlines()
        raise ConfigError(f"checkpoint {path} does not fit this model: {' '.join(first[:3])[:300]}") from None

"""The background writer of a run's checkpoints (a `step_<N>.pt` each, by global rank 0): saved, pruned to
`checkpoint.keep_last`, set aside when unreadable, found for a resume (with a store, the newest of the local folder
and the store's: docs/checkpoints.md). sharded.py's writer of folders of shards extends it."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ...common.errors import ConfigError, JobError, first_line
from ...config import CheckpointConfig
from .files import (
    BEST_FILE,
    TMP_PREFIX,
    NotACheckpoint,
    checkpoint_name,
    checkpoint_store,
    list_checkpoints,
    load_checkpoint,
    remove,
    step_of,
    to_cpu,
    write_atomically,
    write_text_atomically,
)
from .owner import Ownership, run_owning

log = logging.getLogger(__name__)


class Checkpointer(Ownership):
    def __init__(self, folder: Path, config: CheckpointConfig, is_writer: bool, fetches: bool | None = None) -> None:
        self.folder = folder
        self.config = config
        self.is_writer = is_writer
        self.store = checkpoint_store(config, folder)  # store.py's CheckpointStore, or None for a folder
        self.owner: str | None = None  # this run's name in checkpoint.dir's OWNER_FILE, once claimed
        self.fetches = is_writer if fetches is None else fetches  # brings the store's checkpoint down to resume
        self.last_saved_step: int | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._valid: set[Path] = set()  # checkpoints known to load
        self.best: tuple[int, ...] = ()  # steps whose checkpoints checkpoint.keep_best keeps, best first
        self._writing: Path | None = None
        # Called by the writer thread with each checkpoint's step once it is on disk; they must not raise.
        self.on_written: list[Callable[[int], None]] = []
        if is_writer:
            folder.mkdir(parents=True, exist_ok=True)
            # A checkpoint.dir that is some run dir's checkpoints/ may be another, live run's (refused by
            # check_owner, after this): its write under way is not a leftover.
            others = bool(config.dir) and run_owning(folder) is not None
            for leftover in [] if others else folder.glob(f"{TMP_PREFIX}*"):  # from a writer killed mid-write
                remove(leftover)

    def name_of(self, step: int) -> str:
        return checkpoint_name(step)

    def keep_best(self, steps: list[int]) -> None:
        """Keep these steps' checkpoints apart from keep_last, listed best first in best.json: written now,
        before the newest is on disk (a reader takes the first one there)."""
        self.best = tuple(steps)
        if self.is_writer:
            names = [self.name_of(step) for step in steps]
            write_text_atomically(json.dumps({"best": names, "steps": list(steps)}) + "\n", self.folder / BEST_FILE)

    def save(self, step: int, state: dict[str, Any]) -> bool:
        """Snapshot `state` now and write it in the background (the writer only; a step saved or resumed from
        is skipped, and a save waits for the one before); True when a save was started."""
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
            self.check_still_owner()
            write_atomically(payload, path)
            self._written(path, step, started)
        except BaseException as error:  # re-raised on the training thread by wait()
            self._error = error

    def _written(self, path: Path, step: int, started: float, upload: bool = True) -> None:
        """On the writer thread, once a checkpoint is whole under its name: up to the store, tell the callbacks,
        prune."""
        if not upload:  # a folder of shards (sharded.py): not checked before it was written
            self.check_still_owner()
        if self.store is not None and upload:
            self.store.upload(path, path.name)
        self._valid.add(path)
        log.info("saved checkpoint %s (written in %.2f s)", path, time.perf_counter() - started)
        for callback in self.on_written:
            callback(step)
        self.prune()
        if self.store is not None:
            self.store.prune(self.config.keep_last, keep={self.name_of(step) for step in self.best})

    def prune(self) -> None:
        """Keep the newest `keep_last` valid checkpoints and the best (never counted). One that does not load is
        set aside, never counted: it cannot push a good checkpoint out."""
        best = {self.folder / self.name_of(step) for step in self.best}
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
                    self.set_aside(path)
                    log.warning("%s is not a valid checkpoint (%s): set aside as %s.unreadable", path, str(error)[:80],
                                path.name)  # fmt: skip
                    continue
                self._valid.add(path)
            if path not in best:
                valid.append(path)
        for old in valid[self.config.keep_last :]:
            remove(old)
            self._valid.discard(old)

    def set_aside(self, path: Path) -> None:
        """A checkpoint that failed to load: renamed out of the way (by the writer), never tried again."""
        if self.is_writer and path.exists():
            os.replace(path, path.with_name(f"{path.name}.unreadable"))
        self._valid.discard(path)

    def raise_if_failed(self) -> None:
        """Without waiting: the background write's error, if it has failed."""
        if self._error is not None:
            self.wait()

    def wait(self) -> None:
        """Block until the background write (if any) is on disk; its failure is a JobError."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, JobError):  # the store's, after its retries: one line already
                raise error
            if not is_storage_error(error):  # a peer lost during a collective save: torchrun restarts, resumes
                raise RuntimeError(f"writing checkpoint {self._writing} failed: {first_line(error)}") from error
            raise JobError(
                f"writing checkpoint {self._writing} failed ({first_line(error)}); the previous checkpoints are "
                "intact: free some space or fix the run dir's permissions, then launch again"
            ) from error

    def find_resume_payload(self, skip: frozenset[Path] = frozenset()) -> tuple[Path, dict[str, Any]] | None:
        """The checkpoint checkpoint.resume names, loaded (the run's own, once there are any: a restart continues
        the job); None to start afresh. `skip`: checkpoints that failed to load."""
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
        """The newest whole, readable checkpoint of the local folder and the store's (brought down; on a tie the
        local one), and with a store a line that says which and why."""
        local = [path for path in list_checkpoints(self.folder) if path not in skip]
        stored = self.store.names() if self.store is not None and self.fetches else []
        stored = [name for name in stored if self.folder / name not in skip]
        candidates = [(step_of(path.name), 0, path.name) for path in local]
        candidates += [(step_of(name), 1, name) for name in stored]
        candidates.sort(key=lambda item: (-item[0], item[1]))  # the newest first; on a tie the local copy
        for _, in_store, name in candidates:
            if in_store:
                found = self.readable(self.store.download(name, self.folder))
            elif self.store is not None and not self.holds_every_shard(self.folder / name):
                continue  # another node's shards are only in the store: the store's copy of the step, next
            else:
                found = self.readable(self.folder / name)
            if found is not None:
                if self.store is not None and self.fetches:
                    self.store.say_which(name, bool(in_store), local, stored, self.folder)
                return found
        return None

    def say_found(self, path: Path) -> None:
        """newest_readable's line, for the checkpoint the start's checks found."""
        if self.store is not None and self.fetches:
            self.store.say_which(path.name, False, list_checkpoints(self.folder), self.store.names(), self.folder)

    def readable(self, path: Path) -> tuple[Path, dict[str, Any]] | None:
        try:
            return path, load_checkpoint(path)
        except Exception as error:  # truncated or corrupt: the next older one
            log.warning("skipping unreadable checkpoint %s (%s); trying an older one", path, error)
            return None

    def holds_every_shard(self, path: Path) -> bool:
        """Whether a local checkpoint holds all of itself: a file does (sharded.py's answers for a folder)."""
        return True

    def refuse_to_overwrite(self) -> None:
        """checkpoint.resume=never never writes over a run's checkpoints: refused at launch."""
        if self.config.resume != "never":
            return
        existing = [path.name for path in list_checkpoints(self.folder)]
        where = self.folder
        if self.store is not None and not existing:
            existing, where = self.store.names(), self.store.shown
        if existing:
            raise ConfigError(
                f"checkpoint.resume=never but {where} already holds checkpoints ({existing[0]}); "
                "start a new run dir (leave RUN_DIR out) or use checkpoint.resume=auto to continue it"
            )


def is_storage_error(error: BaseException | None) -> bool:
    """Whether a failed write is the disk's doing (full, read-only, no permission), which a restart would
    repeat, rather than a lost peer's in a collective sharded save (DCP gathers the ranks' failures)."""
    if error is None or isinstance(error, ConnectionError):
        return False
    if isinstance(error, OSError):
        return True
    failures = getattr(error, "failures", None)  # torch.distributed.checkpoint's CheckpointException
    if isinstance(failures, dict):
        found = [item[0] if isinstance(item, tuple) else item for item in failures.values()]
        return any(isinstance(item, BaseException) and is_storage_error(item) for item in found)
    return is_storage_error(error.__cause__ or error.__context__)

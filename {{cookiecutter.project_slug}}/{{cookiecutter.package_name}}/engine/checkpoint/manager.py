"""What a checkpoint holds, assembled from the strategy's part and each owner's (a `state_dict()` of its keys and
its exact inverse, `load_state_dict(payload)`, loaded in order, the generator states last) with the format
version, world size and config; when to save; which one to resume (docs/checkpoints.md).
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
from omegaconf import OmegaConf

from ...common.errors import JobError, first_line
from ...common.placement import DistEnv
from ...config import CheckpointConfig
from ...config.compatibility import check_resumable
from ..distributed.process_group import all_gather_int, broadcast_bytes
from .files import FORMAT_VERSION, check_format_version, checkpoint_name, with_owner_tensors

log = logging.getLogger(__name__)


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, payload: dict[str, Any]) -> None: ...


def check_resume(found: tuple[Path, dict[str, Any]] | None, config: dict[str, Any], epochs: int) -> list[str]:
    """Whether `found` may be resumed under `config` (one-line ConfigError if not); the changes it makes."""
    if found is None:
        return []
    check_format_version(*found)
    return check_resumable(found[0], found[1], config, epochs)


class CheckpointManager:
    """The run's checkpoints: what goes in (from the strategy and the owners), when, and the resume."""

    def __init__(self, folder: Path, config: CheckpointConfig, env: DistEnv, strategy: Any,
                 owners: list[Stateful], plain_config: dict[str, Any], epochs: int,
                 run_dir: Path | None = None) -> None:  # fmt: skip
        self.config, self.env, self.strategy, self.owners = config, env, strategy, owners
        self.run_dir = run_dir  # the run checkpoint.dir must belong to (writer.claim)
        self.plain_config, self.epochs = plain_config, epochs
        self.writer = strategy.checkpointer(folder, config, is_writer=env.is_main)  # files.py, sharded.py
        # What the start's checks found to resume from (engine/assembly/checks.py), read once: a list of
        # one (path, payload) or None, taken by resume() in place of reading it again; [] where nothing was.
        self.found_at_start: list[tuple[Path, dict[str, Any]] | None] = []
        if run_dir is not None:  # another run's checkpoint.dir: refused before anything is written there
            self.writer.check_owner(run_dir)
        if self.writer.is_writer:  # the resolved config beside the checkpoints
            (folder / "config.yaml").write_text(OmegaConf.to_yaml(plain_config))

    @property
    def on_written(self) -> list[Callable[[int], None]]:
        return self.writer.on_written

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint holds (a collective: every rank calls it at the same point)."""
        state: dict[str, Any] = {"format_version": FORMAT_VERSION, **self.strategy.state_dict()}
        for owner in self.owners:
            state.update(owner.state_dict())
        return {**state, "world_size": self.env.world_size, "config": self.plain_config}

    def load_state_dict(self, payload: dict[str, Any], source: Path | str) -> list[str]:
        """The exact inverse of state_dict(), at this world size; the settings it changes (config/compatibility.py)."""
        changes = check_resume((Path(source), payload), self.plain_config, self.epochs)
        self.strategy.load_state_dict(payload, Path(source))
        payload = with_owner_tensors(payload, Path(source), self.owners)
        for owner in self.owners:
            owner.load_state_dict(payload)
        log.info(
            "resumed from %s: epoch %d, step %d, %d samples into the epoch (saved by %d processes, now %d)",
            source, payload["epoch"], payload["step"], payload["samples_in_epoch"], payload["world_size"],
            self.env.world_size,
        )  # fmt: skip
        if changes:
            log.info("resumed with settings other than the checkpoint's: %s", "; ".join(changes))
        return changes

    def keep_best(self, steps: list[int]) -> None:
        """checkpoint.keep_best: these steps' checkpoints (best first) are kept whatever keep_last says."""
        self.writer.keep_best(steps)

    def due(self, step: int, epoch_done: bool) -> bool:
        """Whether `checkpoint.every_n_steps` asks for a checkpoint after `step` (an epoch's end has its own)."""
        every_n = self.config.every_n_steps
        return bool(every_n) and step % every_n == 0 and not epoch_done

    def save(self, step: int) -> float | None:
        """Checkpoint `step`; how long training was held (ms), None where nothing was written."""
        started = time.perf_counter()
        # Never a checkpoint of non-finite weights: they would rotate the good ones out.
        if not self.strategy.all_finite():
            raise JobError(
                f"training diverged by step {step}: the weights are not finite, so no checkpoint was written; "
                "lower optim.lr or set trainer.clip_grad_norm, then resume from the last checkpoint"
            )
        if not self.writer.save(step, self.state_dict()):
            return None
        held_ms = 1e3 * (time.perf_counter() - started)
        log.info("checkpoint of step %d: training held %.1f ms, writing in the background", step, held_ms)
        return held_ms

    def wait(self) -> None:
        self.writer.wait()

    def raise_if_failed(self) -> None:
        self.writer.raise_if_failed()

    def resume(self) -> tuple[Path, dict[str, Any]] | None:
        """Load the checkpoint checkpoint.resume names, once checkpoint.dir is claimed; None if none. A sharded one
        whose shards fail to load is set aside for the one before."""
        if self.run_dir is not None:
            self.writer.claim(self.run_dir)
        skip: set[Path] = set()
        while found := agree_on_checkpoint(self.found_here(skip), self.env):
            try:
                self.load_state_dict(found[1], found[0])
                return found
            except BaseException as error:  # DCP's CheckpointException is a BaseException
                from torch.distributed.checkpoint.api import CheckpointException  # slow to import: when needed

                if not isinstance(error, CheckpointException):
                    raise
                log.warning("checkpoint %s does not load (%s); trying the one before", found[0], first_line(error))
                self.writer.set_aside(found[0])
                skip.add(found[0])
        return None

    def found_here(self, skip: set[Path]) -> tuple[Path, dict[str, Any]] | None:
        """This rank's checkpoint to resume from: the one the start's checks read, else read now."""
        if self.found_at_start and not skip:
            found = self.found_at_start.pop()
            if found is not None:
                self.writer.last_saved_step = found[1]["step"]  # resuming from it: no need to write it again
                self.writer.say_found(found[0])
            return found
        return self.writer.find_resume_payload(frozenset(skip))


def agree_on_checkpoint(found: tuple[Path, dict[str, Any]] | None, env: DistEnv) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint any rank holds, on every rank: without a shared filesystem it is sent to the ranks
    that lack it (a job whose node 0 was replaced still resumes)."""
    steps = all_gather_int(found[1]["step"] if found else -1, env.device)
    newest = max(steps)
    if newest < 0 or all(step == newest for step in steps):
        return found
    source = steps.index(newest)
    data = broadcast_bytes(found[0].read_bytes() if env.rank == source and found and found[0].is_file() else None,
                           source, env.device)  # fmt: skip
    if not data:  # a folder of shards: every rank must read its own part of it
        raise JobError(
            f"only some nodes see the sharded checkpoint of step {newest}: a folder of shards needs the run dir on "
            "a filesystem every node shares"
        )
    if found is not None and found[1]["step"] == newest:
        return found
    log.info("rank %d holds no checkpoint of step %d; received it from rank %d", env.rank, newest, source)
    payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    return Path(f"rank{source}:{checkpoint_name(newest)}"), payload

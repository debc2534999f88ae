"""A `checkpoint.dir` (a folder or a store's prefix) belongs to the run that first used it (its OWNER_FILE names
that run's dir; a run dir's own checkpoints/ is that run's by where it lies): another run is refused, so that none
resumes, overwrites or prunes another's checkpoints. The same run dir is the same run (docs/checkpoints.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...common.errors import ConfigError, JobError
from ...common.run_dir import CHECKPOINTS_DIR, LOCK_FILE, LOGS_DIR, MARKERS, METRICS_FILE
from ...config import CheckpointConfig
from .files import OWNER_FILE, owner_id, write_text_atomically

# What a run leaves in its run dir from its start: a folder holding one beside a checkpoints/ is a run's dir.
RUN_DIR_SIGNS = (".hydra", LOGS_DIR, METRICS_FILE, LOCK_FILE, *MARKERS)


def run_owning(folder: Path) -> Path | None:
    """The run dir whose own checkpoints/ `folder` is, by where it lies; None where it is no run's."""
    folder = Path(os.path.abspath(folder))
    if folder.name != CHECKPOINTS_DIR:
        return None
    run_dir = folder.parent
    return run_dir if any((run_dir / sign).exists() for sign in RUN_DIR_SIGNS) else None


class Ownership:
    """The checkpoint writer's claim on checkpoint.dir (writer.py's Checkpointer is one)."""

    config: CheckpointConfig
    folder: Path
    store: Any  # a CheckpointStore, or None
    is_writer: bool
    owner: str | None

    def read_owner(self) -> str | None:
        """The run dir that checkpoint.dir's OWNER_FILE names; None where it has none."""
        if self.store is not None:
            text = self.store.read_text(OWNER_FILE)
        else:
            text = (self.folder / OWNER_FILE).read_text() if (self.folder / OWNER_FILE).is_file() else None
        return text.strip() if text is not None else None

    def check_owner(self, run_dir: Path | None) -> str | None:
        """One line where checkpoint.dir belongs to another run than `run_dir`'s (None: a run dir not made yet);
        its owner, where it has one."""
        if not self.config.dir:
            return None
        mine = owner_id(run_dir) if run_dir is not None else None
        home = run_owning(self.folder) if self.store is None else None
        if home is not None and owner_id(home) != mine:  # its OWNER_FILE may name a run that took it over
            raise ConfigError(
                f"checkpoint.dir={self.config.dir} is the checkpoints/ of the run in {owner_id(home)}, not of this "
                f"one in {mine or 'a new run dir'}: another run may start from its checkpoints (model.init_from, "
                f"checkpoint.resume=<its step_<N>.pt>) but never write there; leave checkpoint.dir out, or launch "
                f"with RUN_DIR={owner_id(home)} to continue that run"
            )
        owner = self.read_owner()
        if owner is not None and owner != mine:
            where = self.store.shown if self.store is not None else self.config.dir
            raise ConfigError(
                f"checkpoint.dir={where} belongs to the run in {owner} (its {OWNER_FILE} says so), not to this "
                f"one in {mine or 'a new run dir'}: give this run a checkpoint.dir of its own, or launch with "
                f"RUN_DIR={owner} to continue that run"
            )
        return owner

    def claim(self, run_dir: Path) -> None:
        """Before a resume: checkpoint.dir must be this run's (check_owner); the writer marks it so at first use."""
        owner = self.check_owner(run_dir)
        if self.config.dir:
            self.owner = owner_id(run_dir)
        if self.is_writer and self.config.dir and owner is None:
            self.write_owner()

    def write_owner(self) -> None:
        if self.store is not None:
            self.store.write_text(OWNER_FILE, f"{self.owner}\n")
        else:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_text_atomically(f"{self.owner}\n", self.folder / OWNER_FILE)

    def check_still_owner(self) -> None:
        """Before each checkpoint: of two runs that claimed checkpoint.dir at once, the one whose mark is not there
        stops; a mark that is gone (a store that came back empty) is written again."""
        if self.owner is None:
            return
        owner = self.read_owner()
        if owner is None:
            self.write_owner()
        elif owner != self.owner:
            where = self.store.shown if self.store is not None else self.config.dir
            raise JobError(
                f"checkpoint.dir={where} now belongs to the run in {owner} (its {OWNER_FILE}), not to this one "
                f"in {self.owner}: two runs were given the same checkpoint.dir; give each its own, then launch "
                "again",
                exit_code=2,
            )

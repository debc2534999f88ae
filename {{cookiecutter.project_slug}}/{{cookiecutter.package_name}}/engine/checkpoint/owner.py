"""A `checkpoint.dir` (a folder or a store's prefix) belongs to the run that first used it: its OWNER_FILE
names that run's dir, and another run is refused, so that no run resumes, overwrites or prunes another's
checkpoints. The run dir's own checkpoints/ is the run's by where it lies. A relaunch (a torchrun restart, a
Slurm requeue, a job moved to another machine) with the same run dir is the same run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...common.errors import ConfigError, JobError
from ...config import CheckpointConfig
from .files import OWNER_FILE, owner_id, write_text_atomically


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
        """One line where checkpoint.dir belongs to another run than the one in `run_dir` (None: a run dir
        not made yet); its owner, where it has one. The run dir's own checkpoints/ (checkpoint.dir="") is
        the run's by where it lies: not checked."""
        if not self.config.dir:
            return None
        owner, mine = self.read_owner(), owner_id(run_dir) if run_dir is not None else None
        if owner is not None and owner != mine:
            where = self.store.shown if self.store is not None else self.config.dir
            raise ConfigError(
                f"checkpoint.dir={where} belongs to the run in {owner} (its {OWNER_FILE} says so), not to this "
                f"one in {mine or 'a new run dir'}: give this run a checkpoint.dir of its own, or launch with "
                f"RUN_DIR={owner} to continue that run"
            )
        return owner

    def claim(self, run_dir: Path) -> None:
        """Before a resume: checkpoint.dir must be this run's (check_owner); the writer marks it so at
        first use. A relaunch (a torchrun restart, a Slurm requeue, a job moved to another machine) with
        the same run dir is the same run."""
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
        """Before each checkpoint: a run launched at the same moment with the same checkpoint.dir may have
        claimed it too; the one whose mark is not there stops rather than mix checkpoints with it. A mark
        that is gone (a store that came back empty) is written again."""
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

"""TensorBoard scalars from rank 0 in <run dir>/tb/ (`log.tensorboard`): `tensorboard --logdir outputs`."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from ..logs import metric_name

FOLDER = "tb"  # in the run dir


class TensorBoardLog:
    """Receives what metrics.jsonl receives and writes the scalars among it, by global step."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.writer: Any = None
        self._starting: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, resumed_step: int, metrics_path: Path, plain_config: dict[str, Any], own_checkpoint: bool) -> None:
        # In the background: tensorboard's import takes rank 0 most of a second, which every other rank
        # would wait for at the first collective; it overlaps the first step instead (docs/speed.md).
        self.folder.mkdir(parents=True, exist_ok=True)
        self._starting = threading.Thread(target=self._open, args=(resumed_step,), name="tensorboard", daemon=True)
        self._starting.start()

    def _open(self, resumed_step: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: a resumed run drops the events of the steps it is about to redo.
            self.writer = SummaryWriter(log_dir=str(self.folder), purge_step=resumed_step + 1)
        except BaseException as error:  # raised where the writer is first used
            self._error = error

    def _started(self) -> None:
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        if self._error is not None:
            raise self._error

    def write(self, kind: str, values: dict[str, Any]) -> None:
        self._started()
        for key, value in values.items():
            tag = metric_name(key)
            if tag is not None:
                self.writer.add_scalar(tag, value, global_step=values["step"])
        self.writer.flush()

    def close(self) -> None:
        self._started()
        if self.writer is not None:
            self.writer.close()


def build(config: Any, run_dir: Path, env: Any) -> TensorBoardLog | None:
    """This sink of observe/sinks/, where `log.tensorboard` switches it on."""
    return TensorBoardLog(run_dir / FOLDER) if config.tensorboard else None

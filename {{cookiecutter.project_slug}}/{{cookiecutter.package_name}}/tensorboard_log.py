"""TensorBoard scalars from rank 0 in <run dir>/tb/: `tensorboard --logdir outputs`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .logs import metric_name


class TensorBoardLog:
    """Receives what metrics.jsonl receives and writes the scalars among it, by global step."""

    def __init__(self, folder: Path, purge_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: a resumed run drops the events of the steps it is about to redo.
        self.writer = SummaryWriter(log_dir=str(folder), purge_step=purge_step)

    def write(self, kind: str, values: dict[str, Any]) -> None:
        for key, value in values.items():
            tag = metric_name(key)
            if tag is not None:
                self.writer.add_scalar(tag, value, global_step=values["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

"""TensorBoard scalars from rank 0 in <run dir>/tb/ (`log.tensorboard`): `tensorboard --logdir outputs`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..logs import metric_name

FOLDER = "tb"  # in the run dir


class TensorBoardLog:
    """Receives what metrics.jsonl receives and writes the scalars among it, by global step."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.writer: Any = None

    def start(self, resumed_step: int, metrics_path: Path, plain_config: dict[str, Any], own_checkpoint: bool) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: a resumed run drops the events of the steps it is about to redo.
        self.writer = SummaryWriter(log_dir=str(self.folder), purge_step=resumed_step + 1)

    def write(self, kind: str, values: dict[str, Any]) -> None:
        for key, value in values.items():
            tag = metric_name(key)
            if tag is not None:
                self.writer.add_scalar(tag, value, global_step=values["step"])
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def build(config: Any, run_dir: Path, env: Any) -> TensorBoardLog | None:
    """This sink of observe/sinks/, where `log.tensorboard` switches it on."""
    return TensorBoardLog(run_dir / FOLDER) if config.tensorboard else None

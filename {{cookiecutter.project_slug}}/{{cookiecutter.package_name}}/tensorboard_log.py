"""TensorBoard scalars from rank 0 in <run dir>/tb/: `tensorboard --logdir outputs`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# metrics.jsonl field -> TensorBoard tag
TAGS = {
    "train_loss": "train/loss",
    "lr": "train/lr",
    "samples_per_s": "train/samples_per_s",
    "val_loss": "val/loss",
    "val_acc": "val/acc",
}


class TensorBoardLog:
    """Receives what metrics.jsonl receives and writes the scalars among it, by global step."""

    def __init__(self, folder: Path, purge_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: a resumed run drops the events of the steps it is about to redo.
        self.writer = SummaryWriter(log_dir=str(folder), purge_step=purge_step)

    def write(self, kind: str, values: dict[str, Any]) -> None:
        for key, tag in TAGS.items():
            if key in values:
                self.writer.add_scalar(tag, values[key], global_step=values["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

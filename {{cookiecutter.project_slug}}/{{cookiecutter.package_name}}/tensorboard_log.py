"""TensorBoard scalars from rank 0 in <run dir>/tb/: `tensorboard --logdir outputs`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# metrics.jsonl field -> TensorBoard tag; every val_<metric> of the task becomes val/<metric>.
TAGS = {"train_loss": "train/loss", "lr": "train/lr", "samples_per_s": "train/samples_per_s"}


class TensorBoardLog:
    """Receives what metrics.jsonl receives and writes the scalars among it, by global step."""

    def __init__(self, folder: Path, purge_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: a resumed run drops the events of the steps it is about to redo.
        self.writer = SummaryWriter(log_dir=str(folder), purge_step=purge_step)

    def write(self, kind: str, values: dict[str, Any]) -> None:
        for key, value in values.items():
            tag = TAGS.get(key) or (f"val/{key[4:]}" if key.startswith("val_") and key != "val_samples" else None)
            if tag is not None:
                self.writer.add_scalar(tag, value, global_step=values["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

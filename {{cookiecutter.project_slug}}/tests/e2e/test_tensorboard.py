"""TensorBoard scalars from rank 0, read back with TensorBoard's own event reader."""

from __future__ import annotations

import pytest

from ..helpers import SMALL, run

pytestmark = pytest.mark.slow


def test_event_files_hold_the_training_and_validation_scalars(tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run(["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", f"RUN_DIR={tmp_path}", *SMALL, "data.train_size=512",
         "log.tensorboard=true"])  # fmt: skip
    files = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(files) == 1, "rank 0 alone writes TensorBoard events"
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert tags == {
        "train/loss",
        "train/lr",
        "train/samples_per_s",
        "train/grad_norm",
        "train/peak_memory_mb",
        "val/loss",
        "val/acc",
        "val/macro_f1",
    }
    assert [e.step for e in events.Scalars("val/acc")] == [8, 16]
    assert 0 <= events.Scalars("val/acc")[-1].value <= 1

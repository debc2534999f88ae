"""The trackers' core in-process (observe/sinks/trackers/): a record reaches a tracker once a checkpoint
covers it, a resume sends what the tracker run lacks and nothing twice, the run ids, a missing package.

The buffering is tested with a tracker that keeps what it is sent; each real tracker has its own test
file, and real jobs in e2e/.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError, Preempted
from {{cookiecutter.package_name}}.config import LogConfig, to_train_config
from {{cookiecutter.package_name}}.engine.checkpoint.writer import Checkpointer
from {{cookiecutter.package_name}}.observe.logs import MetricsLog
from {{cookiecutter.package_name}}.observe.sinks.trackers import IDS_FILE, Held, Record, Trackers, check_installed, tracker_modules

from ....helpers import check_launch_for, compose_config

NAME = sorted(tracker_modules())[0]  # the tracker the config switches on; the tests give it a MemoryTracker
TRAIN = ["train/loss", "train/lr", "train/samples_per_s"]


class MemoryTracker:
    """Keeps what it is sent; `runs` are the runs it already has, by id, and what they hold."""

    def __init__(self, runs: dict[str, Held] | None = None, fail_on_send: bool = False) -> None:
        self.name = NAME
        self.runs = runs or {}
        self.fail_on_send = fail_on_send
        self.sent: list[Record] = []
        self.calls: list[str] = []

    def resume(self, run_id: str) -> Held | None:
        self.calls.append(f"resume {run_id}")
        return self.runs.get(run_id)

    def create(self, plain_config: dict[str, Any]) -> str:
        self.calls.append("create")
        return "new-run"

    def send(self, records: list[Record]) -> None:
        if self.fail_on_send:
            raise ConnectionError("tracking server unreachable")
        self.sent += records

    def finish(self, outcome: str) -> None:
        self.calls.append(f"finish {outcome}")

    def points(self) -> list[tuple[int, str]]:
        return [(record.step, name) for record in self.sent for name in sorted(record.scalars)]


def log_config(*overrides: str) -> LogConfig:
    return to_train_config(compose_config([f"log.{NAME}=true", *overrides])).log


def trackers_of(tracker: MemoryTracker, run_dir: Path) -> Trackers:
    return Trackers(log_config(), run_dir, builder=lambda name, config, run_dir: tracker)


def write_train(metrics: MetricsLog, *steps: int) -> None:
    for step in steps:
        metrics.write("train", step=step, epoch=0, train_loss=1.0 / step, lr=0.1, samples_per_s=100.0)


def write_val(metrics: MetricsLog, step: int) -> None:
    metrics.write("val", step=step, epoch=0, val_loss=0.5, val_acc=0.75, val_samples=100)


def points(steps: list[int], names: list[str]) -> list[tuple[int, str]]:
    return [(step, name) for step in steps for name in sorted(names)]


def test_a_record_reaches_the_tracker_only_once_a_checkpoint_covers_its_step(tmp_path: Path) -> None:
    tracker = MemoryTracker()
    trackers = trackers_of(tracker, tmp_path)
    metrics = MetricsLog(tmp_path / "metrics.jsonl", enabled=True)
    trackers.start(0, metrics.path, {"seed": 0}, own_checkpoint=True)
    metrics.sinks.append(trackers)
    write_train(metrics, 4, 8)
    write_val(metrics, 8)
    write_train(metrics, 12)  # past the checkpoint below: a resume from it redoes step 12
    trackers.commit(10)
    trackers.close()
    assert tracker.points() == points([4], TRAIN) + points([8], TRAIN + ["val/acc", "val/loss"])
    assert tracker.calls == ["create", "finish FINISHED"]


def test_the_checkpoint_writer_commits_each_checkpoint_once_it_is_on_disk(tmp_path: Path) -> None:
    tracker = MemoryTracker()
    trackers = trackers_of(tracker, tmp_path)
    trackers.start(0, tmp_path / "metrics.jsonl", {"seed": 0}, own_checkpoint=True)
    checkpoints = Checkpointer(tmp_path / "checkpoints", to_train_config(compose_config()).checkpoint, True)
    checkpoints.on_written.append(trackers.commit)
    trackers.write("train", {"step": 5, "train_loss": 0.5})
    trackers.write("train", {"step": 6, "train_loss": 0.4})
    checkpoints.save(5, {"model": {"w": torch.zeros(2)}, "step": 5})
    checkpoints.wait()
    trackers.close()
    assert tracker.points() == [(5, "train/loss")]


def test_a_resume_sends_what_the_tracker_run_lacks_and_nothing_twice(tmp_path: Path) -> None:
    metrics = MetricsLog(tmp_path / "metrics.jsonl", enabled=True)
    write_train(metrics, 4, 8)
    write_val(metrics, 8)
    write_train(metrics, 12)  # the job died with this step's checkpoint on disk, before its records were sent
    # The run holds the training scalars up to step 8, and of step 8's validation the loss only.
    held = Held({name: 8 for name in TRAIN} | {"val/loss": 8})
    tracker = MemoryTracker({"run-1": held})
    trackers = trackers_of(tracker, tmp_path)
    trackers.load_state_dict({"trackers": {NAME: "run-1"}})  # what the checkpoint holds
    trackers.start(12, metrics.path, {"seed": 0}, own_checkpoint=True)
    trackers.close()
    assert tracker.calls == ["resume run-1", "finish FINISHED"]
    assert tracker.points() == [(8, "val/acc")] + points([12], TRAIN)
    assert trackers.state_dict() == {"trackers": {NAME: "run-1"}}


def test_a_tracker_run_holding_steps_past_the_resumed_one_gives_way_to_a_new_run(tmp_path: Path, caplog) -> None:
    metrics = MetricsLog(tmp_path / "metrics.jsonl", enabled=True)
    write_train(metrics, 4, 8)
    tracker = MemoryTracker({"run-1": Held({"train/loss": 16})})  # resumed from an older checkpoint than it saw
    trackers = trackers_of(tracker, tmp_path)
    trackers.load_state_dict({"trackers": {NAME: "run-1"}})
    with caplog.at_level(logging.WARNING):
        trackers.start(8, metrics.path, {"seed": 0}, own_checkpoint=True)
        trackers.close()
    assert tracker.calls == ["resume run-1", "finish KILLED", "create", "finish FINISHED"]
    assert tracker.points() == points([4, 8], TRAIN), "the new run gets the whole history"
    assert "holds steps up to 16, past step 8" in caplog.text
    assert json.loads((tmp_path / IDS_FILE).read_text()) == {NAME: "new-run"}


@pytest.mark.parametrize(
    ("file_id", "checkpoint_id", "own_checkpoint", "resumed"),
    [
        (None, "ckpt-run", True, "ckpt-run"),  # a new node 0 without the run dir's file: the checkpoint's
        ("file-run", "ckpt-run", True, "file-run"),  # the run dir's file is the newer
        (None, "ckpt-run", False, None),  # checkpoint.resume=PATH of another run: new runs, not that run's
    ],
)
def test_the_run_id_comes_from_the_run_dir_then_the_checkpoint_and_is_kept_in_both(
    tmp_path: Path, file_id: str | None, checkpoint_id: str, own_checkpoint: bool, resumed: str | None
) -> None:
    if file_id is not None:
        (tmp_path / IDS_FILE).write_text(json.dumps({NAME: file_id}))
    tracker = MemoryTracker({"ckpt-run": Held(), "file-run": Held()})
    trackers = trackers_of(tracker, tmp_path)
    trackers.load_state_dict({"trackers": {NAME: checkpoint_id}})
    trackers.start(0, tmp_path / "metrics.jsonl", {"seed": 0}, own_checkpoint=own_checkpoint)
    trackers.close()
    expected = resumed or "new-run"
    assert tracker.calls[0] == (f"resume {resumed}" if resumed else "create")
    assert json.loads((tmp_path / IDS_FILE).read_text()) == {NAME: expected}
    assert trackers.state_dict() == {"trackers": {NAME: expected}}, "the next checkpoint keeps it too"


@pytest.mark.parametrize(
    ("error", "outcome"), [(RuntimeError("diverged"), "FAILED"), (Preempted("stop", 15), "KILLED")]
)
def test_a_job_that_ends_by_an_exception_ends_its_tracker_runs_unfinished(
    tmp_path: Path, error: Exception, outcome: str
) -> None:
    tracker = MemoryTracker()
    trackers = trackers_of(tracker, tmp_path)
    trackers.start(0, tmp_path / "metrics.jsonl", {"seed": 0}, own_checkpoint=True)
    try:  # as Trainer.fit's `finally` closes them
        raise error
    except type(error):
        trackers.close()
    assert tracker.calls == ["create", f"finish {outcome}"]


def test_a_failing_tracker_is_dropped_with_a_warning_and_training_goes_on(tmp_path: Path, caplog) -> None:
    tracker = MemoryTracker(fail_on_send=True)
    trackers = trackers_of(tracker, tmp_path)
    with caplog.at_level(logging.WARNING):
        trackers.start(0, tmp_path / "metrics.jsonl", {"seed": 0}, own_checkpoint=True)
        trackers.write("train", {"step": 4, "train_loss": 0.5})
        trackers.commit(4)
        trackers.close()
    assert f"{NAME} could not take the metrics (ConnectionError: tracking server unreachable)" in caplog.text
    assert tracker.calls == ["create"], "a dropped tracker gets nothing more"


def test_a_switched_on_tracker_without_its_package_is_one_line_before_the_launch(monkeypatch) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == NAME else real_find_spec(name))
    with pytest.raises(ConfigError) as raised:
        check_launch_for([f"log.{NAME}=true"])
    assert str(raised.value) == (
        f"log.{NAME}=true but {NAME} is not installed: pip install {NAME} (or pip install -e '.[{NAME}]'), "
        f"or set log.{NAME}=false"
    )
    check_installed(to_train_config(compose_config()).log)  # switched off: not needed

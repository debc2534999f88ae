"""engine/checkpoint/manager.py through a Trainer in this process: a checkpoint's state loads back exactly,
and one of a newer format is refused in one line; a save says how long it held training and never
writes non-finite weights; a resume says where it resumed from and what settings it changed, and claims
checkpoint.dir for its run."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError, JobError
from {{cookiecutter.package_name}}.engine.assembly.components import run_records
from {{cookiecutter.package_name}}.engine.checkpoint.files import FORMAT_VERSION, list_checkpoints
from {{cookiecutter.package_name}}.engine.preemption import StopOnSigterm

from ...helpers import assert_same, trainer


def test_load_state_dict_is_the_exact_inverse_of_state_dict(tmp_path: Path) -> None:
    trained = trainer(tmp_path / "a")
    stop = StopOnSigterm()
    try:
        trained.train_epoch(stop)  # momentum buffers, counters and generator states that are not fresh
    finally:
        stop.close()
    saved = trained.checkpoints.state_dict()
    assert saved["step"] == 3 and saved["samples_in_epoch"] == 96 and saved["optimizer"]["state"]
    assert saved["format_version"] == FORMAT_VERSION, "what a later version's code reads to know it"
    resumed = trainer(tmp_path / "b")
    resumed.checkpoints.load_state_dict(saved, "memory")
    again = resumed.checkpoints.state_dict()
    # A run's record (observe/, where the project keeps one) is the start's that writes the checkpoint, not state.
    for key in {key for module in run_records() for key in module.RUN_RECORD().state_dict()}:
        del again[key], saved[key]
    assert_same(again, saved)


def test_a_checkpoint_of_a_newer_format_is_refused_in_one_line(tmp_path: Path) -> None:
    saved = trainer(tmp_path / "a").checkpoints.state_dict()
    with pytest.raises(ConfigError, match=r"format version 99, newer than this code's 1: update the project's code"):
        trainer(tmp_path / "b").checkpoints.load_state_dict({**saved, "format_version": 99}, "step_5.pt")


def test_a_save_says_how_long_it_held_training_and_diverged_weights_are_never_written(tmp_path: Path, caplog) -> None:
    trained = trainer(tmp_path)
    caplog.set_level(logging.INFO)
    before = time.perf_counter()
    held = trained.save()
    elapsed_ms = 1e3 * (time.perf_counter() - before)
    trained.checkpoints.wait()
    assert held is not None and 0 <= held <= elapsed_ms, (held, elapsed_ms)
    assert f"checkpoint of step 0: training held {held:.1f} ms, writing in the background" in caplog.messages
    assert [path.name for path in list_checkpoints(tmp_path / "checkpoints")] == ["step_00000000.pt"]
    trained.state.step = 1
    with torch.no_grad():
        next(trained.model.parameters()).view(-1)[0] = float("nan")
    with pytest.raises(JobError) as diverged:
        trained.save()
    assert str(diverged.value) == (
        "training diverged by step 1: the weights are not finite, so no checkpoint was written; "
        "lower optim.lr or set trainer.clip_grad_norm, then resume from the last checkpoint"
    )
    trained.checkpoints.wait()
    assert [path.name for path in list_checkpoints(tmp_path / "checkpoints")] == ["step_00000000.pt"]


def test_a_resume_says_where_from_and_which_settings_it_changed(tmp_path: Path, caplog) -> None:
    saved = trainer(tmp_path / "a").checkpoints.state_dict()
    caplog.set_level(logging.INFO)
    resumed = trainer(tmp_path / "b", "optim.lr=0.05", "trainer.log_every_n_steps=7")
    resumed.checkpoints.load_state_dict(saved, "step_0.pt")
    assert "resumed from step_0.pt: epoch 0, step 0, 0 samples into the epoch (saved by 1 processes, now 1)" in (
        caplog.messages
    )
    changed = [m for m in caplog.messages if m.startswith("resumed with settings other than the checkpoint's: ")]
    assert len(changed) == 1, caplog.messages
    parts = changed[0].split(": ", 1)[1].split("; ")  # each change "key: old -> new", "; " apart
    assert sorted(part.split(": ")[0] for part in parts) == ["optim.lr", "trainer.log_every_n_steps"], changed[0]
    assert all(re.fullmatch(r"[\w.]+: \S+ -> \S+", part) for part in parts) and " -> 0.05" in changed[0], changed[0]


def test_a_resume_claims_checkpoint_dir_for_its_run_and_another_run_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    trainer(tmp_path / "a", f"checkpoint.dir={shared}")  # built: resumed from nothing, the dir claimed
    assert (shared / ".owner").is_file()
    trainer(tmp_path / "a", f"checkpoint.dir={shared}")  # the same run, relaunched
    with pytest.raises(ConfigError, match=f"checkpoint.dir={shared} belongs to the run in "):
        trainer(tmp_path / "b", f"checkpoint.dir={shared}")

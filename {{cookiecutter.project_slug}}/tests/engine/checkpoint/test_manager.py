"""engine/checkpoint/manager.py through a Trainer in this process: a checkpoint's state loads back exactly,
and one of a newer format is refused in one line; a save says how long it held training and never
writes non-finite weights; a resume says where it resumed from and what settings it changed, claims
checkpoint.dir for its run, and passes over a sharded checkpoint that does not load."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError, JobError
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.engine.checkpoint.files import FORMAT_VERSION, list_checkpoints
from {{cookiecutter.package_name}}.engine.preemption import StopOnSigterm

from ...helpers import TINY, assert_same, compose_config, on_ranks, train_one_epoch, trainer


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
    # The run's record is the one of the start that writes the checkpoint (observe/provenance.py), not state.
    assert again.pop("provenance")["started"] >= saved.pop("provenance")["started"]
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


def resume_past_a_corrupt_shard(env, run_dir: Path) -> tuple[int, list[str]]:
    """Sharded checkpoints at steps 2 and 4 of a 6-step epoch; rank 1's shard of the newest cut in half;
    a relaunch, whose writer renames the checkpoint it sets aside only once the resume is done: the
    latest any rank can see the rename (a rank that looks for the one before sooner must skip it itself)."""
    from {{cookiecutter.package_name}}.engine.checkpoint.writer import Checkpointer

    overrides = [*TINY, "data.batch_size=8", "strategy=fsdp", "checkpoint.every_n_steps=2"]
    config = to_train_config(compose_config(overrides))
    trained = build_trainer(config, env, run_dir)
    train_one_epoch(trained)
    torch.distributed.barrier()
    if env.rank == 0:
        shard = run_dir / "checkpoints" / "step_00000004" / "__1_0.distcp"
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    torch.distributed.barrier()
    heard: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: heard.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("{{cookiecutter.package_name}}.engine.checkpoint.manager").addHandler(handler)
    held_back, set_aside = [], Checkpointer.set_aside
    Checkpointer.set_aside = lambda writer, path: held_back.append((writer, path))  # type: ignore[method-assign]
    resumed = build_trainer(config, env, run_dir)
    for writer, path in held_back:
        set_aside(writer, path)
    return resumed.state.step, heard


@pytest.mark.slow
def test_a_sharded_checkpoint_that_does_not_load_is_set_aside_for_the_one_before(tmp_path: Path) -> None:
    for step, heard in on_ranks(2, resume_past_a_corrupt_shard, tmp_path, timeout=60):
        assert step == 2, "resumed from the checkpoint before"
        warned = [line for line in heard if " does not load (" in line]
        assert len(warned) == 1 and warned[0].startswith(f"checkpoint {tmp_path / 'checkpoints' / 'step_00000004'} "
                                                         "does not load ("), heard  # fmt: skip
        reason = warned[0].split(" does not load (", 1)[1].removesuffix("); trying the one before")
        assert warned[0].endswith("); trying the one before") and reason.startswith("CheckpointException: "), warned[0]
        assert "\n" not in reason, warned[0]  # the error's first line
    assert (tmp_path / "checkpoints" / "step_00000004.unreadable").is_dir()

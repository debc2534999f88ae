"""engine/checkpoint/manager.py through a Trainer in this process: a checkpoint's state loads back exactly,
and one of a newer format is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.engine.preemption import StopOnSigterm
from {{cookiecutter.package_name}}.errors import ConfigError

from ...helpers import assert_same, trainer


def test_load_state_dict_is_the_exact_inverse_of_state_dict(tmp_path: Path) -> None:
    trained = trainer(tmp_path / "a")
    stop = StopOnSigterm()
    try:
        trained.train_epoch(stop)  # momentum buffers, counters and generator states that are not fresh
    finally:
        stop.close()
    saved = trained.state_dict()
    assert saved["step"] == 3 and saved["samples_in_epoch"] == 96 and saved["optimizer"]["state"]
    resumed = trainer(tmp_path / "b")
    resumed.load_state_dict(saved, "memory")
    assert_same(resumed.state_dict(), saved)


def test_a_checkpoint_of_a_newer_format_is_refused_in_one_line(tmp_path: Path) -> None:
    saved = trainer(tmp_path / "a").state_dict()
    with pytest.raises(ConfigError, match=r"format version 99, newer than this code's 1: update the project's code"):
        trainer(tmp_path / "b").load_state_dict({**saved, "format_version": 99}, "step_5.pt")

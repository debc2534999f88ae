"""entry.py, what a worker checks and fixes up before training: the legacy launcher's argument, room on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.config import ConfigError
from {{cookiecutter.package_name}}.entry import accept_legacy_local_rank


@pytest.mark.parametrize(
    "argv",
    [
        ["train.py", "--local-rank=1", "trainer.epochs=2"],
        ["train.py", "--local_rank=1", "trainer.epochs=2"],
        ["train.py", "--local-rank", "1", "trainer.epochs=2"],
    ],
)
def test_legacy_local_rank_argument_is_accepted(argv, monkeypatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    accept_legacy_local_rank(argv)
    assert argv == ["train.py", "trainer.epochs=2"]
    assert os.environ["LOCAL_RANK"] == "1"


def test_a_disk_without_room_for_checkpoints_is_refused_before_training(tmp_path: Path, monkeypatch) -> None:
    import shutil

    from {{cookiecutter.package_name}}.entry import check_room_for_checkpoints

    model = torch.nn.Linear(1000, 1000)  # 4 MB of weights: about 24 MB for checkpoints
    check_room_for_checkpoints(tmp_path / "run", model)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=10 * 2**20))
    with pytest.raises(ConfigError, match=r"has 10 MiB free, and checkpoints of this model need about 23 MiB"):
        check_room_for_checkpoints(tmp_path / "run", model)

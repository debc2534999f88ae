"""The TensorBoard sink in-process (observe/sinks/tensorboard.py); its event files from a real job:
e2e/test_tensorboard.py."""

from __future__ import annotations

from pathlib import Path

from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.build import build_trainer

from ...helpers import SMALL, compose_config, cpu_env


def test_tensorboard_can_be_switched_off(tmp_path: Path) -> None:
    def sinks(flag: str) -> list[str]:
        config = to_train_config(compose_config([*SMALL, "data.train_size=96", f"log.tensorboard={flag}"]))
        return [type(sink).__name__ for sink in build_trainer(config, cpu_env(0, 1), tmp_path / flag).metrics.sinks]

    assert "TensorBoardLog" in sinks("true") and "TensorBoardLog" not in sinks("false")
    assert (tmp_path / "true" / "tb").is_dir() and not (tmp_path / "false" / "tb").exists()

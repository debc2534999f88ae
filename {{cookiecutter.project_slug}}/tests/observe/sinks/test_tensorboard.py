"""The TensorBoard sink in-process (observe/sinks/tensorboard.py); its event files from a real job:
e2e/test_tensorboard.py."""

from __future__ import annotations

from pathlib import Path

from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer

from ...helpers import SMALL, compose_config, cpu_env


def test_tensorboard_can_be_switched_off(tmp_path: Path) -> None:
    def sinks(flag: str) -> list[str]:
        config = to_train_config(compose_config([*SMALL, "data.train_size=96", f"log.tensorboard={flag}"]))
        return [type(sink).__name__ for sink in build_trainer(config, cpu_env(0, 1), tmp_path / flag).metrics.sinks]

    assert "TensorBoardLog" in sinks("true") and "TensorBoardLog" not in sinks("false")
    assert (tmp_path / "true" / "tb").is_dir() and not (tmp_path / "false" / "tb").exists()


def test_the_new_figures_and_a_callbacks_figure_reach_the_event_file(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    package = "{{cookiecutter.package_name}}"
    config = to_train_config(compose_config([*SMALL, "data.train_size=96", "data.val_size=16", "trainer.max_steps=2",
                                             "trainer.log_every_n_steps=1", "log.tensorboard=true",
                                             f"+callbacks.norm._target_={package}.callbacks.LogWeightNorm",
                                             "+callbacks.norm.every=1"]))  # fmt: skip
    build_trainer(config, cpu_env(0, 1), tmp_path).fit()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/grad_norm", "train/peak_memory_mb", "weights/norm"} <= tags
    assert [event.step for event in events.Scalars("train/grad_norm")] == [1, 2]
    assert [event.step for event in events.Scalars("weights/norm")] == [1, 2]

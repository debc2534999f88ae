"""config/diagnostics.py: trainer.profile_steps and trainer.memory_snapshot, their defaults and their one-line
errors, and that a resume may change them."""

from __future__ import annotations

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.config.compatibility import OPERATIONAL
from {{cookiecutter.package_name}}.config.diagnostics import step_range

from ..helpers import compose_config


def test_the_trainer_section_has_the_profiler_settings_off_by_default() -> None:
    trainer = to_train_config(compose_config()).trainer
    assert (trainer.profile_steps, trainer.memory_snapshot) == ("", False)
    assert step_range("trainer.profile_steps", "5:8") == (5, 8) and step_range("trainer.profile_steps", "") is None
    assert {"trainer.profile_steps", "trainer.memory_snapshot"} <= set(OPERATIONAL), "a resume may change them"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.profile_steps=5:3"],
            "trainer.profile_steps=5:3: START is after END; give START <= END, e.g. trainer.profile_steps=3:5",
        ),
        (["trainer.profile_steps=abc"], "trainer.profile_steps='abc' is not START:END, steps numbered from 1"),
        (["trainer.profile_steps=0:4"], "trainer.profile_steps='0:4' is not START:END, steps numbered from 1"),
        (["trainer.profile_steps=7"], "trainer.profile_steps='7' is not START:END"),
        (["trainer.memory_snapshot=true"], "trainer.memory_snapshot=true records the steps of trainer.profile_steps"),
    ],
)
def test_bad_profile_settings_are_one_line_config_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        to_train_config(compose_config(overrides))
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)

"""config/generate.py: generate.py's keys, composed from configs/generate.yaml and checked before any work."""

from __future__ import annotations

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.config.generate import GenerateConfig

from ..helpers import compose_config

GIVEN = ["task=language_model", "ckpt_path=run/checkpoints/step_00000010.pt", "prompt='import os'"]


def test_the_defaults_sample_200_tokens_from_all_at_temperature_1() -> None:
    config = to_train_config(compose_config(GIVEN, name="generate"))
    assert isinstance(config, GenerateConfig) and config.prompt == "import os"
    assert (config.max_new_tokens, config.temperature, config.top_k, config.tokenizer) == (200, 1.0, None, None)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("prompt=''", "prompt= is empty"),
        ("max_new_tokens=0", "max_new_tokens must be a whole number >= 1"),
        ("temperature=-0.5", "temperature must be a number >= 0"),
        ("top_k=0", "top_k must be a whole number >= 1"),
    ],
)
def test_a_wrong_setting_is_refused_in_one_line(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        to_train_config(compose_config([*GIVEN, override], name="generate"))


def test_a_prompt_is_required() -> None:
    with pytest.raises(ConfigError, match="missing mandatory value: prompt"):
        to_train_config(compose_config(GIVEN[:2], name="generate"))

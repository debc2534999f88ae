"""config/strategies.py: TrainConfig has a section for each strategy's settings the project has, each
with train.yaml's defaults, and a section no chosen strategy reads is refused unless left as it is."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import TrainConfig, to_train_config
from {{cookiecutter.package_name}}.config.strategies import (
    SECTION_TYPES,
    STRATEGY_SECTIONS,
    check_strategy_options,
    with_strategy_sections,
)
from {{cookiecutter.package_name}}.config.values import train_defaults

from ..helpers import compose_config


def test_train_config_has_a_typed_section_for_each_strategy_setting_with_train_yamls_defaults() -> None:
    assert STRATEGY_SECTIONS["ddp"] == ("ddp",)
    read = {section for sections in STRATEGY_SECTIONS.values() for section in sections}
    assert read == {"ddp", *SECTION_TYPES}, "each section some strategy reads is a field (ddp's is core)"
    assert set(SECTION_TYPES) <= {item.name for item in fields(TrainConfig)}
    config, defaults = to_train_config(compose_config()), train_defaults()
    for name, kind in SECTION_TYPES.items():
        assert isinstance(getattr(config, name), kind)
        assert vars(getattr(config, name)) == defaults[name], f"{name}: train.yaml's values"

    @dataclass
    @with_strategy_sections
    class Fresh:
        seed: int = 0

    assert [item.name for item in fields(Fresh)] == ["seed", *SECTION_TYPES]


def test_a_section_the_chosen_strategy_does_not_read_is_refused_unless_left_as_train_yaml_has_it(monkeypatch) -> None:
    monkeypatch.setitem(STRATEGY_SECTIONS, "elsewhere", ())  # a strategy that reads none of ddp's settings
    config = to_train_config(compose_config(["ddp.bucket_cap_mb=50"]))
    check_strategy_options(config)  # under ddp: its own
    config.strategy = "elsewhere"
    with pytest.raises(ConfigError, match=r"^ddp.bucket_cap_mb=50.0 is a DDP option, and strategy=elsewhere does not "
                                          r"use it: drop it, or use strategy=ddp$"):  # fmt: skip
        check_strategy_options(config)
    config.ddp = to_train_config(compose_config()).ddp
    check_strategy_options(config)  # left as train.yaml has it: nothing ignored
    config.trainer.precision = "fp16"
    with pytest.raises(ConfigError, match="^trainer.precision=fp16 needs loss scaling, which strategy=elsewhere"):
        check_strategy_options(config)

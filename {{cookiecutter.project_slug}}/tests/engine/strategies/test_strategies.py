"""engine/strategies/: the strategies are the modules beside its __init__.py, each the one its name says and
the config knows; a strategy= that is none of the project's is refused (each strategy's own tests:
test_<name>.py beside this file)."""

from __future__ import annotations

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import STRATEGY_SECTIONS, to_train_config
from {{cookiecutter.package_name}}.engine.strategies import names, strategy_class

from ...helpers import PROJECT_DIR, compose_config


def test_an_unknown_strategy_is_refused() -> None:
    with pytest.raises(ConfigError, match=f"strategy='zero3' is not one of {', '.join(names())}$"):
        to_train_config(compose_config(["strategy=zero3"]))


def test_the_strategies_are_the_modules_beside_the_interface_each_of_its_name_and_known_to_the_config() -> None:
    assert names()[0] == "ddp" and (PROJECT_DIR / "tests/engine/strategies" / "test_ddp.py").exists()
    assert all((PROJECT_DIR / "tests/engine/strategies" / f"test_{name}.py").exists() for name in names())
    assert [strategy_class(name).name for name in names()] == names()
    assert sorted(STRATEGY_SECTIONS) == names(), "each strategy's config sections (config/schema.py)"

"""engine/strategies/: a strategy= that is none of the project's is refused (each strategy's own
tests: test_ddp.py, test_fsdp.py, test_hsdp.py)."""

from __future__ import annotations

import pytest

from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.errors import ConfigError

from ...helpers import compose_config


def test_an_unknown_strategy_is_refused() -> None:
    with pytest.raises(ConfigError, match="strategy='zero3' is not one of ddp, fsdp"):
        to_train_config(compose_config(["strategy=zero3"]))

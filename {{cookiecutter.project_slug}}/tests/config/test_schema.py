"""config/schema.py: the typed schema: a wrong type fails at composition, each section's check refuses
what cannot work in one line naming the key."""

from __future__ import annotations

import re

import pytest
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import to_train_config

from ..helpers import compose_config


@pytest.mark.parametrize("override", ["ddp.static_graph=maybe", "trainer.epochs=1.5"])
def test_wrong_types_fail_at_composition(override: str) -> None:
    with pytest.raises((HydraException, OmegaConfBaseException), match=override.split("=")[0].split(".")[-1]):
        compose_config([override])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("ddp.comm_hook=int8", "ddp.comm_hook"),
        ("ddp.powersgd_rank=0", "ddp.powersgd_rank"),
        ("ddp.powersgd_start_iter=1", "ddp.powersgd_start_iter must be >= 2"),
    ],
)
def test_bad_comm_hook_settings_are_refused_naming_the_key(override: str, message: str) -> None:
    # The launch script's refusal of these (tests/e2e/test_comm_hooks.py) is in the slow set: here in-process.
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        to_train_config(compose_config([override]))
    assert "\n" not in str(error.value)

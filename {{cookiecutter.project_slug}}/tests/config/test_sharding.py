"""config/sharding.py: the sections strategy=fsdp and hsdp read, in TrainConfig with train.yaml's
defaults; their rules; fsdp.blocks is the key activation checkpointing takes under every strategy."""

from __future__ import annotations

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import STRATEGY_SECTIONS, to_train_config
from {{cookiecutter.package_name}}.config.sharding import FSDPConfig, HSDPConfig, fsdp_of, hsdp_of
from {{cookiecutter.package_name}}.config.strategies import BLOCKS

from ..helpers import compose_config


def test_the_sections_are_typed_and_read_by_their_strategies() -> None:
    config = to_train_config(compose_config(["strategy=hsdp", "hsdp.shard_size=2", "fsdp.cpu_offload=true"]))
    assert isinstance(fsdp_of(config), FSDPConfig) and fsdp_of(config).cpu_offload is True
    assert isinstance(hsdp_of(config), HSDPConfig) and hsdp_of(config).shard_size == 2
    assert STRATEGY_SECTIONS["fsdp"] == ("fsdp",) and STRATEGY_SECTIONS["hsdp"] == ("fsdp", "hsdp")
    assert BLOCKS == "fsdp.blocks"
    from {{cookiecutter.package_name}} import config as package  # where they were imported from before

    assert (package.FSDPConfig, package.HSDPConfig) == (FSDPConfig, HSDPConfig)  # tests/config/test_config.py
    with pytest.raises(ConfigError, match=r"^hsdp.shard_size must be >= 0 \(0: each node's processes\), got -1$"):
        to_train_config(compose_config(["strategy=hsdp", "hsdp.shard_size=-1"]))

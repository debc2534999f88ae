"""config/object_storage.py: the settings object stores add: checkpoint.store_retry_s, a setting of the
checkpoint section checked positive, and the data keys a resume may change (a store's shards cached
elsewhere)."""

from __future__ import annotations

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import CheckpointConfig, to_plain_dict, to_train_config

from ..helpers import compose_config
from .test_compatibility import plain, resume


def test_store_retry_s_is_a_checkpoint_setting_checked_positive() -> None:
    assert CheckpointConfig(dir="s3://bucket/run").store_retry_s == 120.0, "its default"
    config = to_train_config(compose_config(["data=synthetic", "checkpoint.store_retry_s=3"]))
    assert config.checkpoint.store_retry_s == 3.0 and to_plain_dict(config)["checkpoint"]["store_retry_s"] == 3.0
    for value in ("0", "-1"):
        with pytest.raises(ConfigError) as refused:
            to_train_config(compose_config(["data=synthetic", f"checkpoint.store_retry_s={value}"]))
        assert str(refused.value).startswith(f"checkpoint.store_retry_s must be > 0, got {float(value)}"), refused.value


def test_a_stores_shards_cached_elsewhere_are_a_change_a_resume_allows_and_lists() -> None:
    shards = ["data=shards", "task=classification"]  # on a new machine, with its own cache
    moved = resume(plain(*shards), plain(*shards, "data.cache_dir=/scratch/cache", "data.cache_limit_gb=2"))
    assert moved == ["data.cache_dir: '' -> '/scratch/cache'", "data.cache_limit_gb: 10 -> 2"]

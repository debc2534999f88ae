"""The settings of object stores (common/object_store.py): the checkpoint section's `store_retry_s`
(schema.py's CheckpointConfig has a field for each of SECTION_FIELDS' "checkpoint", found by what is
present) and its rule, and the data keys a resume may change (a store's shards cached elsewhere:
compatibility.py). No torch."""

from __future__ import annotations

from typing import Any

from .values import require_positive

# section -> {key: (type, default)}: train.yaml gives each its default and its meaning.
SECTION_FIELDS = {"checkpoint": {"store_retry_s": (float, 120.0)}}  # a failing store is retried this long (store.py)
RESUMABLE_LOADER_KEYS = ("data.cache_dir", "data.cache_limit_gb")  # the same samples, cached elsewhere


def check_section(section: str, config: Any) -> None:
    if section == "checkpoint":
        require_positive("checkpoint.store_retry_s", config.store_retry_s)

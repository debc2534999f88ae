"""Settings that must agree, where the engine checks them: every rank's with every other's (a collective at start),
and a checkpoint's prepared data with a resume's. The rules: config/compatibility.py."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from ...common.errors import ConfigError, JobError
from ...common.placement import DistEnv

# The rules moved below the engine (config/compatibility.py); they stay importable from here.
from ...config.compatibility import (  # noqa: F401
    LOADER_KEYS,
    OPERATIONAL,
    REFUSED,
    SHOWN,
    STARTING_KEYS,
    between_nodes,
    check_resumable,
    differences,
    leaves,
    listed,
    under,
)
from ..distributed.process_group import all_gather_bytes


class SamePreparedData:
    """A checkpoint's owner (checkpoint/manager.py) that records the id of the prepared data it was trained on
    (new at each prepare): a resume on data prepared again under the same `data.root` is refused as a changed
    `data.*` key is, unless `checkpoint.allow_changes` accepts `data.root`. `prepared`: the training set's
    {"root", "id"}, None for a set not prepared; a checkpoint without the record passes."""

    def __init__(self, prepared: dict[str, str] | None, allowed: list[str]) -> None:
        self.prepared, self.allowed = prepared, list(allowed)

    def state_dict(self) -> dict[str, Any]:
        return {"prepared_data": self.prepared["id"]} if self.prepared else {}  # the id only: the root may hold a key

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        saved = payload.get("prepared_data")
        if not saved or self.prepared is None or saved == self.prepared["id"] or under("data.root", self.allowed):
            return
        raise ConfigError(
            f"data.root={self.prepared['root']} was prepared again since the checkpoint was written (its id "
            f"{self.prepared['id'][:12]}, the checkpoint's {saved[:12]}): resuming would go on with other data "
            "mid-epoch. Launch with the data it was trained on, give a new run dir (RUN_DIR, or RUN_NAME on many "
            "nodes) to start a new run, or accept it: checkpoint.allow_changes=[data.root]"
        )


def check_same_config_everywhere(config: dict[str, Any], env: DistEnv) -> None:
    """Every rank runs with the same settings (a collective: one hash each, then, only if they differ, the
    configs); else a JobError (exit code 2) naming the keys and the nodes, on every rank."""
    text = json.dumps(config, sort_keys=True, default=str)
    digests = all_gather_bytes(hashlib.sha256(text.encode()).digest(), env.device)
    if len(set(digests)) == 1:
        return
    node = int(os.environ.get("GROUP_RANK", "0"))
    entries = [json.loads(data) for data in all_gather_bytes(json.dumps([node, text]).encode(), env.device)]
    reference_node, reference = entries[0][0], json.loads(entries[0][1])
    told: dict[int, str] = {}
    for other_node, other in entries:
        if other_node in told or other_node == reference_node:
            continue
        changed = between_nodes(reference, json.loads(other))  # checkpoint.resume must agree too
        if changed:
            shown = "; ".join(f"{key}={new!r} where node {reference_node} has {old!r}"
                              for key, (old, new) in list(changed.items())[:SHOWN])  # fmt: skip
            told[other_node] = f"node {other_node}: {shown}"
    raise JobError(
        f"the nodes were launched with different settings ({'; '.join(told.values())}): launch every node with "
        "the same overrides",
        exit_code=2,
    )

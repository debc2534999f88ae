"""data.global_batch_size: data.batch_size and trainer.grad_accum_steps derived for the job's world size
(docs/recipe.md). No torch: the launcher checks it before torchrun starts, the workers derive it.
"""

from __future__ import annotations

from typing import Any

from ..common.errors import ConfigError
from .values import require, whole_number

SHOWN = 8  # world sizes named in a refusal


def global_batch_keys(node: dict[str, Any]) -> dict[str, int | None]:
    """data.global_batch_size and data.micro_batch_size of a data node: null (off) or a whole number >= 1."""
    given = {key: node.get(key) for key in ("global_batch_size", "micro_batch_size")}
    for key, value in given.items():
        if value is not None:
            whole_number(f"data.{key}", value, 1)
    require(
        given["micro_batch_size"] is None or given["global_batch_size"] is not None,
        "data.micro_batch_size caps the per-process share of data.global_batch_size: set that too, or give the "
        "per-process batch as data.batch_size",
    )
    return given


def split_global_batch(global_batch: int, micro_batch: int | None, world_size: int) -> tuple[int, int]:
    """(per-process micro-batch, accumulation steps) of `global_batch` on `world_size` processes: the fewest
    accumulation steps whose micro-batch is at most `micro_batch`."""
    if global_batch % world_size:
        works = [size for size in range(1, global_batch + 1) if global_batch % size == 0]
        works = sorted(sorted(works, key=lambda size: abs(size - world_size))[:SHOWN])
        lower, higher = global_batch - global_batch % world_size, global_batch + world_size - global_batch % world_size
        nearest = f"{lower} or {higher}" if lower else f"{higher}"
        raise ConfigError(
            f"data.global_batch_size={global_batch} does not split evenly among {world_size} processes: run on "
            f"{', '.join(map(str, works))} processes, or give a global batch that {world_size} divides (e.g. {nearest})"
        )
    per_process = global_batch // world_size
    cap = micro_batch or per_process
    accum = next(steps for steps in range(1, per_process + 1) if not per_process % steps and per_process <= steps * cap)
    return per_process // accum, accum


def apply_global_batch(config: Any, world_size: int) -> None:
    """A TrainConfig's data.batch_size and trainer.grad_accum_steps for `world_size`, where global_batch_size
    is set (from it alone: applying it again changes nothing)."""
    data = config.data
    if data.global_batch_size is not None:
        data.batch_size, config.trainer.grad_accum_steps = split_global_batch(
            data.global_batch_size, data.micro_batch_size, world_size
        )

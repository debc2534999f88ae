"""Each rank's random generators (dropout and the like) across a resume, as a checkpoint's part.

Their states go into every checkpoint (`rank_states`, every rank's, gathered) and come back on a
resume at the same world size: the run ends bit-identical to an uninterrupted one. On another world
size they are seeded afresh from (seed, step, rank): training continues correctly, with other
dropout masks than an uninterrupted run would have drawn.
"""

from __future__ import annotations

import io
import logging
import random
from typing import Any

import torch

from ...common.placement import DistEnv
from ...datasets.randomness import MASK64, sample_seed
from .process_group import all_gather_bytes

log = logging.getLogger(__name__)


def seed_rank(seed: int, step: int, rank: int) -> None:
    """Fresh generator states for one rank: each rank draws its own dropout masks."""
    draw = sample_seed(seed, step, -1 - rank)
    torch.manual_seed(draw & (MASK64 >> 1))
    random.seed(draw)


def rank_state(device: torch.device) -> dict[str, Any]:
    """This rank's generator states, as tensors and plain values (what a checkpoint may hold)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def load_rank_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def gather_rank_states(device: torch.device) -> list[dict[str, Any]]:
    """Every rank's generator states, in rank order (a collective: all ranks call it)."""
    buffer = io.BytesIO()
    torch.save(rank_state(device), buffer)
    return [torch.load(io.BytesIO(data), weights_only=True) for data in all_gather_bytes(buffer.getvalue(), device)]


def restore_rank_state(saved: list[dict[str, Any]] | None, seed: int, step: int, rank: int, world_size: int,
                       device: torch.device) -> bool:  # fmt: skip
    """This rank's saved generator states when the world size is the one they were saved at
    (True); otherwise fresh states from (seed, step, rank) (False)."""
    if saved and len(saved) == world_size:
        load_rank_state(saved[rank], device)
        return True
    seed_rank(seed, step, rank)
    return False


class RankGenerators:
    """The checkpoint's `rank_states`: this part of a checkpoint, saved and loaded."""

    def __init__(self, seed: int, env: DistEnv) -> None:
        self.seed, self.env = seed, env

    def state_dict(self) -> dict[str, Any]:
        return {"rank_states": gather_rank_states(self.env.device)}

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        env = self.env
        if not restore_rank_state(payload["rank_states"], self.seed, payload["step"], env.rank, env.world_size,
                                  env.device):  # fmt: skip
            log.info("generator states seeded afresh for %d processes: other dropout masks than saved", env.world_size)

    def start_afresh(self) -> None:
        """No checkpoint to resume: each rank's own generators, from the seed and its rank."""
        seed_rank(self.seed, 0, self.env.rank)

"""Each rank's random generators (dropout and the like) as a checkpoint's part (`rank_states`): restored at the same
world size (bit-identical to an uninterrupted run), else seeded afresh from (seed, step, rank): docs/checkpoints.md.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import torch

from ...common.placement import DistEnv
from ...datasets.randomness import MASK64, sample_seed
from .process_group import all_gather_tensors

log = logging.getLogger(__name__)


def seed_rank(seed: int, step: int, rank: int) -> None:
    """Fresh generator states for one rank: each rank draws its own dropout masks."""
    draw = sample_seed(seed, step, -1 - rank)
    torch.manual_seed(draw & (MASK64 >> 1))
    random.seed(draw)


def gather_rank_states(device: torch.device) -> list[dict[str, Any]]:
    """Every rank's generator states as tensors and plain values, in rank order (a collective)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return all_gather_tensors(state, device)


def restore_rank_state(saved: list[dict[str, Any]] | None, seed: int, step: int, rank: int, world_size: int,
                       device: torch.device) -> bool:  # fmt: skip
    """This rank's saved generator states at the world size they were saved at (True), else fresh ones (False)."""
    if saved and len(saved) == world_size:
        state = saved[rank]
        torch.set_rng_state(state["torch"])
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        if device.type == "cuda" and "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"], device)
        return True
    seed_rank(seed, step, rank)
    return False


class RankGenerators:
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

"""generators.py: each rank's generators (dropout and the like) across a resume: the same draws at the
same world size, fresh ones from (seed, step, rank) at another."""

from __future__ import annotations

import io
import logging
import random

import torch

from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.engine.distributed.generators import RankGenerators, seed_rank

from ...helpers import cpu_env, on_ranks


def draws() -> tuple[list[float], float, list[float]]:
    """What dropout and the like would draw next: from torch's generator and Python's."""
    return torch.rand(4).tolist(), random.random(), torch.randn(2).tolist()


def through_a_file(state: dict) -> dict:
    """As a checkpoint holds it: saved, and loaded back with weights_only."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_a_restored_state_repeats_the_draws_exactly() -> None:
    generators = RankGenerators(seed=3, env=cpu_env(0, 1))
    generators.start_afresh()
    draws()  # a few steps of dropout
    saved = through_a_file({**generators.state_dict(), "step": 5})
    expected = draws()
    torch.manual_seed(1234)  # what a restarted process starts with
    random.seed(1234)
    RankGenerators(seed=3, env=cpu_env(0, 1)).load_state_dict(saved)
    assert draws() == expected


def afresh(seed: int, step: int, rank: int) -> tuple[list[float], float, list[float]]:
    seed_rank(seed, step, rank)
    return draws()


def test_states_of_another_world_size_are_seeded_afresh_from_seed_step_and_rank(caplog) -> None:
    generators = RankGenerators(seed=3, env=cpu_env(0, 1))
    generators.start_afresh()
    one_rank = generators.state_dict()["rank_states"]
    saved = {"rank_states": one_rank * 2, "step": 12}  # what two ranks saved
    after_save = draws()
    with caplog.at_level(logging.INFO):
        RankGenerators(seed=3, env=cpu_env(0, 1)).load_state_dict(saved)
    got = draws()
    assert got != after_save, "not rank 0's saved state"
    assert got == afresh(3, 12, 0)
    assert "generator states seeded afresh for 1 processes" in caplog.text
    RankGenerators(seed=3, env=cpu_env(2, 3)).load_state_dict(saved)  # three ranks now: rank 2's own
    assert draws() == afresh(3, 12, 2)
    RankGenerators(seed=3, env=cpu_env(0, 1)).load_state_dict({"rank_states": None, "step": 12})
    assert draws() == afresh(3, 12, 0), "no states saved: afresh too"


def test_fresh_states_differ_by_rank_step_and_seed_and_repeat_for_the_same_three() -> None:
    assert afresh(3, 12, 0) == afresh(3, 12, 0)
    others = [afresh(3, 12, 1), afresh(3, 13, 0), afresh(4, 12, 0)]
    for other in others:
        assert other[0] != afresh(3, 12, 0)[0] and other[1] != afresh(3, 12, 0)[1]


def test_a_run_without_a_checkpoint_starts_each_rank_from_the_seed_and_its_rank() -> None:
    torch.manual_seed(99)
    random.seed(99)
    RankGenerators(seed=3, env=cpu_env(1, 2)).start_afresh()
    assert draws() == afresh(3, 0, 1)


def save_and_restore_on_rank(env: DistEnv) -> dict:
    torch.manual_seed(100 + env.rank)  # each rank its own generators, as after training
    random.seed(env.rank)
    generators = RankGenerators(seed=3, env=env)
    saved = through_a_file({**generators.state_dict(), "step": 8})
    expected = draws()
    torch.manual_seed(0)  # a restarted rank: the same fresh start everywhere
    random.seed(0)
    RankGenerators(seed=3, env=env).load_state_dict(saved)
    return {"saved": saved["rank_states"], "expected": expected, "restored": draws()}


def test_every_ranks_states_are_gathered_in_rank_order_and_each_rank_gets_its_own_back() -> None:
    ranks = on_ranks(2, save_and_restore_on_rank)
    for rank, result in enumerate(ranks):
        assert len(result["saved"]) == 2, "every rank's states, in every checkpoint"
        assert result["restored"] == result["expected"], f"rank {rank} draws on exactly"
    torch.manual_seed(100 + 1)
    assert torch.equal(ranks[0]["saved"][1]["torch"], torch.get_rng_state()), "rank 1's state at index 1"
    torch.manual_seed(100)
    assert torch.equal(ranks[1]["saved"][0]["torch"], torch.get_rng_state()), "rank 0's state at index 0"
    assert ranks[0]["expected"] != ranks[1]["expected"]

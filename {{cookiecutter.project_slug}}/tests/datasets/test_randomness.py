"""datasets/randomness.py: a sample's draws from (seed, epoch, index); each rank's generator states across a resume."""

from __future__ import annotations

import random

import pytest
import torch

from {{cookiecutter.package_name}}.datasets.randomness import (
    as_int64,
    building_sample,
    current_sample,
    sample_generator,
    sample_seed,
    sample_seeds,
    seeded_by_sample,
)
from {{cookiecutter.package_name}}.engine.distributed.generators import gather_rank_states, restore_rank_state

INDICES = [*range(200), 1000, 2**31 + 5, 49999, 123456789, 2**40 + 3]  # as tests/test_augment.py's


def test_a_samples_seed_mixes_all_three_parts_and_the_vectorised_draw_agrees() -> None:
    seeds = {sample_seed(s, e, i) for s in range(3) for e in range(3) for i in range(3)}
    assert len(seeds) == 27 and all(0 <= seed < 2**64 for seed in seeds)
    indices = torch.tensor([0, 1, 7, 1000])
    expected = [sample_seed(4, 2, int(i)) for i in indices]
    assert [value % 2**64 for value in sample_seeds(4, 2, indices).tolist()] == expected
    assert (as_int64(2**63 - 1), as_int64(2**63), as_int64(2**64 - 1)) == (2**63 - 1, -(2**63), -1)


def test_the_sample_generator_draws_from_the_sample_being_built_and_only_there() -> None:
    with building_sample(1, 2, 3):
        assert current_sample() == (1, 2, 3)
        first = torch.rand(3, generator=sample_generator())
        assert torch.equal(first, torch.rand(3, generator=sample_generator())), "the same sample, the same draws"
    with building_sample(1, 2, 4):
        assert not torch.equal(first, torch.rand(3, generator=sample_generator()))
    for index in range(3, 11):  # seeded as seeded_by_sample() seeds torch's global generator: all 63 bits
        with building_sample(1, 2, index):
            assert sample_generator().initial_seed() == sample_seed(1, 2, index) & (2**63 - 1)
            drawn = torch.rand(3, generator=sample_generator())
            with seeded_by_sample():
                assert torch.equal(drawn, torch.rand(3))
    with pytest.raises(RuntimeError) as unknown:
        current_sample()
    assert str(unknown.value) == "current_sample() is only known while the project's loader builds a sample"


def test_rank_states_come_back_at_the_same_world_size_and_are_seeded_afresh_on_another() -> None:
    torch.manual_seed(5)
    random.seed(5)
    saved = gather_rank_states(torch.device("cpu"))
    expected = (torch.rand(2), random.random())
    torch.manual_seed(99)
    assert restore_rank_state(saved, seed=0, step=10, rank=0, world_size=1, device=torch.device("cpu"))
    assert torch.equal(torch.rand(2), expected[0]) and random.random() == expected[1], "dropout resumes exactly"
    assert not restore_rank_state(saved, seed=0, step=10, rank=1, world_size=2, device=torch.device("cpu"))
    afresh = torch.rand(2)
    restore_rank_state(saved, seed=0, step=10, rank=1, world_size=2, device=torch.device("cpu"))
    assert torch.equal(torch.rand(2), afresh), "a function of (seed, step, rank)"
    restore_rank_state(saved, seed=0, step=10, rank=0, world_size=2, device=torch.device("cpu"))
    assert not torch.equal(torch.rand(2), afresh), "each rank its own"


def test_sample_seeds_are_sample_seed_of_each_index() -> None:
    indices = torch.tensor(INDICES)
    assert sample_seeds(11, 5, indices).tolist() == [as_int64(sample_seed(11, 5, i)) for i in INDICES]

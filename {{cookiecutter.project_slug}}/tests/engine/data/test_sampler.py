"""The training sampler and the evaluation split: which rank sees which samples, at any world size."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from {{cookiecutter.package_name}}.engine.data.sampler import ResumableDistributedSampler, eval_shard

from ...helpers import cpu_env


def epoch_keys(size: int, world_size: int, batch_size: int, epoch: int, start: int = 0, seed: int = 7) -> list[list]:
    """Each rank's keys for one epoch."""
    result = []
    for rank in range(world_size):
        sampler = ResumableDistributedSampler(size, cpu_env(rank, world_size), batch_size, seed=seed)
        sampler.set_epoch(epoch)
        sampler.set_start(start)
        keys = list(sampler)
        assert len(keys) == len(sampler)
        result.append(keys)
    return result


def real_indices(per_rank: list[list]) -> list[int]:
    return [index for keys in per_rank for index, _, weight in keys if weight > 0]


def test_set_epoch_changes_the_order() -> None:
    first, second = epoch_keys(100, 1, 10, epoch=0)[0], epoch_keys(100, 1, 10, epoch=1)[0]
    assert [k[0] for k in first] != [k[0] for k in second]
    assert sorted(k[0] for k in first) == sorted(k[0] for k in second) == list(range(100))
    assert {key[1] for key in first} == {0} and {key[1] for key in second} == {1}, "each key names its epoch"


def test_the_order_is_a_function_of_the_seed_and_the_epoch_and_nothing_else() -> None:
    def order(seed: int, epoch: int) -> list[int]:
        return [index for index, _, _ in epoch_keys(50, 1, 5, epoch=epoch, seed=seed)[0]]

    assert order(3, 2) == order(3, 2)
    assert order(3, 2) != order(4, 2), "another seed, another order"
    assert order(0, 1) != order(1, 0), "seed and epoch are mixed, not added"


# (10, 4, 2) and (9, 4, 2) end with a global batch of 2 and of 1 sample: ranks left without one get padding.
@pytest.mark.parametrize(
    ("size", "world_size", "batch_size"), [(100, 2, 10), (101, 3, 8), (13, 4, 4), (5, 4, 8), (10, 4, 2), (9, 4, 2)]
)
def test_ranks_see_disjoint_samples_covering_the_epoch_once(size, world_size, batch_size) -> None:
    per_rank = epoch_keys(size, world_size, batch_size, epoch=3)
    seen = real_indices(per_rank)
    assert sorted(seen) == list(range(size)), "every sample exactly once, no padding repeats"
    steps = {len(DataLoader(keys, batch_size=batch_size)) for keys in per_rank}
    assert len(steps) == 1, "every rank must take the same number of steps"
    padding = [key for keys in per_rank for key in keys if key[2] == 0.0]
    last_global_batch = size % (world_size * batch_size) or world_size * batch_size
    assert len(padding) == max(0, world_size - last_global_batch), "one padding key per rank left without a sample"
    assert all(key[2] in (0.0, 1.0) for keys in per_rank for key in keys)


def test_real_samples_in_a_step_count_the_short_last_global_batch() -> None:
    sampler = ResumableDistributedSampler(50, cpu_env(0, 2), 8, seed=0)  # global batches of 16
    assert [sampler.real_samples_in_step(done, 1) for done in (0, 32, 48)] == [16, 16, 2]
    assert sampler.real_samples_in_step(16, 3) == 34, "three global batches, the last one short"


def test_order_is_independent_of_world_size() -> None:
    def global_order(world_size: int) -> list[int]:
        per_rank = epoch_keys(64, world_size, 8, epoch=2)
        steps = len(per_rank[0]) // 8
        return [i for step in range(steps) for keys in per_rank for i, _, _ in keys[step * 8 : (step + 1) * 8]]

    assert global_order(1) == global_order(2) == global_order(4)


def test_resume_mid_epoch_on_another_world_size_sees_the_rest_once() -> None:
    size, batch_size = 103, 8
    first_three_steps = [keys[: 3 * batch_size] for keys in epoch_keys(size, 2, batch_size, epoch=1)]
    done = real_indices(first_three_steps)
    rest = real_indices(epoch_keys(size, 3, batch_size, epoch=1, start=len(done)))
    assert sorted(done + rest) == list(range(size))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
def test_eval_shards_cover_an_odd_set_without_padding(world_size: int) -> None:
    shards = [list(eval_shard(999, rank, world_size)) for rank in range(world_size)]
    assert sum(shards, []) == list(range(999))


def test_a_set_that_draws_its_own_order_is_sampled_in_it_from_the_seed_and_epoch() -> None:
    class Reversed:  # a set's own order (a set read in shards: a few at a time), from the generator
        def __len__(self) -> int:
            return 12

        def sample_order(self, generator):
            return torch.randperm(12, generator=generator).flip(0)

    own = ResumableDistributedSampler.for_dataset(Reversed(), cpu_env(0, 1), 4, seed=3)
    plain = ResumableDistributedSampler.for_dataset(range(12), cpu_env(0, 1), 4, seed=3)
    for epoch in (0, 1):
        own.set_epoch(epoch), plain.set_epoch(epoch)
        assert own.epoch_order().tolist() == plain.epoch_order().flip(0).tolist()
    assert [index for index, _, _ in own] == own.epoch_order().tolist()


def test_the_order_of_a_seed_and_epoch_never_changes_so_an_older_runs_checkpoint_resumes_on_its_samples() -> None:
    """Pinned: a run saved mid-epoch by an earlier version of the code resumes after the samples it
    trained on only if (seed, epoch) still draws the same permutation (how it is drawn is the contract)."""

    def order(epoch: int) -> list[int]:
        sampler = ResumableDistributedSampler(12, cpu_env(0, 1), 4, seed=0)
        sampler.set_epoch(epoch)
        return sampler.epoch_order().tolist()

    assert order(0) == [5, 1, 0, 10, 7, 9, 2, 11, 6, 8, 3, 4]
    assert order(3) == [8, 6, 3, 10, 2, 1, 5, 9, 7, 4, 0, 11]


def test_a_fresh_sampler_starts_at_the_epochs_beginning() -> None:
    sampler = ResumableDistributedSampler(10, cpu_env(1, 2), 2, seed=0)
    assert len(sampler) == 5 and len(list(sampler)) == 5 and sampler.steps_left() == 3
    sampler.set_start(4)
    assert len(sampler) == 3 and sampler.steps_left() == 2

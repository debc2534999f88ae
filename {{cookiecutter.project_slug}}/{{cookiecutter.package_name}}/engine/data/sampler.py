"""Which rank sees which samples: the resumable training sampler and the exact evaluation split.

Determinism is the contract here: an epoch's sample order is a function of (seed, epoch) alone,
not of the number of processes or DataLoader workers. That is what lets a run resume bit-exactly,
also on another world size, and lets evaluation give the same figures at any world size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import torch
from torch.utils.data import Dataset, DistributedSampler

from ...common.placement import DistEnv
from ...datasets.randomness import MASK64, sample_seed

ORDER_KEY = -(2**40)  # the "index" an epoch's order is drawn from: no sample has it

# A training key names one sample of one epoch; weight 0 marks padding that fills a rank's
# share of the last, short global batch (it runs through the model but adds no gradient).
TrainKey = tuple[int, int, float]  # (index, epoch, weight)


class ResumableDistributedSampler(DistributedSampler):
    """DistributedSampler whose order ignores the world size and that can start mid-epoch.

    Each epoch's order is a permutation drawn from (seed, epoch) alone. Global batches of
    world_size * batch_size consecutive samples of that order are split among the ranks; the
    last, short one is split as evenly as possible, and a rank left with nothing gets one
    padding key of weight 0. So no sample is dropped or repeated, whatever the world size,
    and `set_start(n)` resumes after the first n samples of the epoch, also on another world
    size. Call `set_epoch(epoch)` before every epoch, as with DistributedSampler.

    A set that draws its own order (its `sample_order(generator)`: a set read in shards reads few at a
    time) gets that order, from the same generator: still one permutation of (seed, epoch) alone, so all
    of the above holds.
    """

    skipped: tuple[int, ...] = ()  # the samples no epoch holds (skip), in index order

    def __init__(
        self,
        dataset_size: int,
        env: DistEnv,
        batch_size: int,
        seed: int,
        sample_order: Callable[[torch.Generator], torch.Tensor] | None = None,
    ) -> None:
        # DistributedSampler reads only the len() of its data set: a range stands in for it
        super().__init__(cast(Dataset, range(dataset_size)), num_replicas=env.world_size, rank=env.rank, seed=seed)
        self.dataset_size = dataset_size
        self.batch_size = batch_size
        self.start = 0
        self.sample_order = sample_order  # the set's own permutation of an epoch, from the generator

    @classmethod
    def for_dataset(cls, dataset: Any, env: DistEnv, batch_size: int, seed: int) -> ResumableDistributedSampler:
        """The sampler of `dataset`: in the set's own order where it draws one (its sample_order)."""
        return cls(len(dataset), env, batch_size, seed, getattr(dataset, "sample_order", None))

    @property
    def global_batch_size(self) -> int:
        """One micro-batch of every rank: an optimizer step takes trainer.grad_accum_steps of them in a row,
        data.global_batch_size samples where that is set (config/batches.py), at any world size."""
        return self.num_replicas * self.batch_size

    def skip(self, indices: Iterable[int]) -> None:
        """Leave these samples out of every epoch's order (trainer.skip_samples), before the order is split
        into global batches: the same global batches, less them, at any world size. From then on
        `dataset_size` (what set_start, the step counts and an epoch's end go by) is what an epoch trains on."""
        whole = self.dataset_size + len(self.skipped)
        skipped = tuple(sorted(set(indices)))
        if skipped and not 0 <= skipped[0] <= skipped[-1] < whole:
            raise ValueError(f"samples to skip must be indices of the training set (0 to {whole - 1}): {skipped}")
        self.skipped, self.dataset_size = skipped, whole - len(skipped)

    def set_start(self, samples_done: int) -> None:
        """Skip the first `samples_done` samples of the epoch's order (those already trained on)."""
        self.start = samples_done

    def epoch_order(self) -> torch.Tensor:
        """This epoch's permutation of the set, drawn from (seed, epoch) well mixed: seed s in epoch
        e+1 shares no order with seed s+1 in epoch e."""
        generator = torch.Generator().manual_seed(sample_seed(self.seed, self.epoch, ORDER_KEY) & (MASK64 >> 1))
        if self.sample_order is not None:
            order = self.sample_order(generator)
        else:  # drawn over the whole set: the samples left in keep their places relative to each other
            order = torch.randperm(self.dataset_size + len(self.skipped), generator=generator)
        return order[~torch.isin(order, torch.tensor(self.skipped, dtype=order.dtype))] if self.skipped else order

    def steps_left(self) -> int:
        return math.ceil((self.dataset_size - self.start) / self.global_batch_size)

    def real_samples_in_step(self, samples_done: int, global_batches: int) -> int:
        """How many real (non-padding) samples the next `global_batches` global batches hold."""
        return min(global_batches * self.global_batch_size, self.dataset_size - samples_done)

    def rank_slice(self, chunk_size: int) -> tuple[int, int]:
        """(offset, length) of this rank's share of a global batch of chunk_size samples."""
        if chunk_size == self.global_batch_size:
            return self.rank * self.batch_size, self.batch_size
        base, extra = divmod(chunk_size, self.num_replicas)
        return self.rank * base + min(self.rank, extra), base + (1 if self.rank < extra else 0)

    def __iter__(self) -> Iterator[TrainKey]:
        order = self.epoch_order()[self.start :].tolist()
        for begin in range(0, len(order), self.global_batch_size):
            chunk = order[begin : begin + self.global_batch_size]
            offset, length = self.rank_slice(len(chunk))
            if length == 0:
                yield chunk[0], self.epoch, 0.0
            for index in chunk[offset : offset + length]:
                yield index, self.epoch, 1.0

    def __len__(self) -> int:
        remaining = self.dataset_size - self.start
        full, last = divmod(remaining, self.global_batch_size)
        return full * self.batch_size + (max(1, self.rank_slice(last)[1]) if last else 0)


def eval_shard(size: int, rank: int, world_size: int) -> range:
    """This rank's contiguous share of the evaluation set: no padding, no sample twice."""
    return range(size * rank // world_size, size * (rank + 1) // world_size)

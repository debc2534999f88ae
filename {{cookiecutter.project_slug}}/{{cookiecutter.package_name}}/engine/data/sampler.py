"""Which rank sees which samples: the resumable training sampler and the exact evaluation split. An epoch's
order is a function of (seed, epoch) alone: a run resumes bit-exactly, also on another world size.
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
    """DistributedSampler whose order ignores the world size and that can start mid-epoch (`set_start`).

    Global batches of world_size * batch_size consecutive samples of the epoch's order are split among the
    ranks; the last, short one as evenly as possible, a rank left with nothing getting one padding key of
    weight 0: no sample is dropped or repeated. A set with its own `sample_order(generator)` (one read in
    shards) gets that order, from the same generator.
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
        """One micro-batch of every rank (an optimizer step takes trainer.grad_accum_steps of them)."""
        return self.num_replicas * self.batch_size

    def skip(self, indices: Iterable[int]) -> None:
        """Leave these samples (checked by the caller) out of every epoch's order, before
        it is split into global batches; from then on `dataset_size` is what an epoch trains on."""
        whole = self.dataset_size + len(self.skipped)
        self.skipped = tuple(sorted(set(indices)))
        self.dataset_size = whole - len(self.skipped)

    def set_start(self, samples_done: int) -> None:
        """Skip the first `samples_done` samples of the epoch's order (those already trained on)."""
        self.start = samples_done

    def epoch_order(self) -> torch.Tensor:
        """This epoch's permutation, drawn from (seed, epoch) well mixed: seed s in epoch e+1 shares no order with
        seed s+1 in epoch e."""
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

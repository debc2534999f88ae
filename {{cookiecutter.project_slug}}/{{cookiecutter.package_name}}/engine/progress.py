"""Where training stands (TrainState: what, with the model and the optimizer, continues a run
bit-exactly) and how an epoch's micro-batches are grouped into optimizer steps."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .sampler import ResumableDistributedSampler


@dataclass
class TrainState:
    """Where training stands: enough, with model and optimizer, to continue bit-exactly."""

    epoch: int = 0
    step: int = 0  # global optimizer steps taken
    samples_in_epoch: int = 0  # samples of `epoch`'s order already trained on, over all ranks

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        self.epoch, self.step, self.samples_in_epoch = payload["epoch"], payload["step"], payload["samples_in_epoch"]


@dataclass
class Interval:
    """Loss and sample counts since the last log line, kept on the device: no sync per step."""

    loss_sum: torch.Tensor
    steps: int = 0
    lr: float = 0.0  # the learning rate of the last step (a scheduler has set the next one's since)
    samples: int = 0
    started: float = field(default_factory=time.perf_counter)

    def reset(self) -> None:
        self.loss_sum.zero_()
        self.steps, self.samples, self.started = 0, 0, time.perf_counter()


@dataclass
class OptimizerStep:
    """One optimizer step: its micro-batches (read once, in order) and its real sample count."""

    micro_batches: Iterator[Any]  # (inputs, targets, weights, indices) from the loader
    count: int  # micro-batches in the step: grad_accum_steps, fewer at the epoch's end
    real_samples: int  # non-padding samples in the step's global batch, over all ranks


def optimizer_steps(
    batches: Iterable[Any], sampler: ResumableDistributedSampler, accum: int
) -> Iterator[OptimizerStep]:
    """The rest of the epoch's micro-batches, grouped into optimizer steps of `accum` each."""
    batches, left, samples_done = iter(batches), sampler.steps_left(), sampler.start
    while left > 0:
        count = min(accum, left)
        real_samples = sampler.real_samples_in_step(samples_done, count)
        yield OptimizerStep(itertools.islice(batches, count), count, real_samples)
        left, samples_done = left - count, samples_done + real_samples

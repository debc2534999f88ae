"""Exact evaluation: every rank scores a disjoint, unpadded share; the sums are all-reduced.

The figures equal a one-process evaluation of the same weights at any world size, also when
the set size is not divisible by it (DistributedSampler would pad with repeated samples). A figure
that counted nothing over the whole set (a (total, count) pair's count 0 everywhere: every target
masked) is NaN, not 0: a 0 would be ranked the best validation of the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..datasets.collate import model_forward, to_device
from ..tasks import Task
from .distributed.process_group import all_gather_int, all_reduce_sum


@dataclass(frozen=True)
class EvalResult:
    metrics: dict[str, float]  # the task's metrics, each the mean over the whole set (its samples, or its items)
    samples: int
    nothing_counted: tuple[str, ...] = ()  # val_<name> of the figures NaN because their count was 0 everywhere

    @property
    def loss(self) -> float:
        return self.metrics["loss"]

    def record(self) -> dict[str, Any]:
        """The figures as metrics.jsonl and the trackers take them: val_<name>, val_samples."""
        return {**{f"val_{name}": value for name, value in self.metrics.items()}, "val_samples": self.samples}

    def line(self) -> str:
        figures = " ".join(f"val_{name}={value:.6f}" for name, value in self.metrics.items())
        return f"{figures} val_samples={self.samples}"

    def uncounted(self) -> str:
        """Why some figures are NaN, in one line, where they counted no items; "" where all counted some."""
        if not self.nothing_counted:
            return ""
        return (f"{', '.join(self.nothing_counted)} {'are' if len(self.nothing_counted) > 1 else 'is'} NaN: the "
                "validation counted no items (every target masked?); such a validation is never ranked best nor "
                "counted as an improvement")  # fmt: skip


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: DataLoader, task: Task, device: torch.device, lockstep: bool = False
) -> EvalResult:
    """The task's metrics over the whole evaluation set, the same on every rank.

    Pass the unwrapped model: DDP's forward would broadcast buffers and expect every rank
    to run the same number of forwards, which uneven shards do not. A sharded model (fsdp)
    gathers its parameters in every forward, so every rank must run as many: `lockstep`
    pads the shorter shards with forwards of one sample whose figures are dropped.
    """
    was_training = model.training
    model.eval()
    sums: torch.Tensor | None = None  # per name: the values' (or the totals') sum, then their count
    samples = torch.zeros((), dtype=torch.float64, device=device)
    forwards = max(all_gather_int(len(loader), device)) if lockstep else len(loader)
    batches, filler = iter(loader), None

    def metrics_of(batch: Any) -> dict[str, Any]:
        inputs, targets, _, _ = batch
        return task.metrics(model_forward(model, to_device(inputs, device)), to_device(targets, device))

    for _ in range(max(forwards, 1)):  # one forward at least: an empty shard learns the metric names
        batch = next(batches, None)
        if batch is None:  # this rank's shard is shorter (or empty): a filler forward, figures dropped
            filler = filler or one_sample(loader)
        values = metrics_of(batch if batch is not None else filler)
        if sums is None:
            names = list(values)
            sums = torch.zeros(2, len(names), dtype=torch.float64, device=device)
        if batch is not None:  # float64 sums: the order of addition varies with the world size, the result must not
            size = len(batch[2])  # its samples (their weights)
            sums += torch.stack([summed(values[name], size) for name in names], dim=1)
            samples += size
    all_reduce_sum(sums)
    all_reduce_sum(samples)
    model.train(was_training)
    totals, counts = sums.tolist()  # type: ignore[union-attr]
    means = {name: total / count if count else math.nan  # nothing counted: no figure (a 0 would rank best)
             for name, total, count in zip(names, totals, counts, strict=True)}  # fmt: skip
    figures = summarised(task, means)
    empty = tuple(f"val_{name}" for name, value in figures.items() if math.isnan(value)) if 0 in counts else ()
    return EvalResult(figures, int(samples.item()), empty)


def summed(value: Any, samples: int) -> torch.Tensor:
    """A metric's (sum, count) in float64: a (total, count) pair as it is, per-sample values summed over
    their `samples`."""
    if isinstance(value, tuple):
        total, count = value
        return torch.stack([total.double(), torch.as_tensor(count, dtype=torch.float64, device=total.device)])
    return torch.stack([value.double().sum(), torch.tensor(float(samples), dtype=torch.float64, device=value.device)])


def summarised(task: Task, means: dict[str, float]) -> dict[str, float]:
    """The figures: the task's `summarise(means)` where it has one (a ratio of two sums over the whole set,
    as LanguageModel's bits per byte of a BPE), else the means of its per-sample values."""
    summarise = getattr(task, "summarise", None)
    return summarise(means) if callable(summarise) else means


def one_sample(loader: DataLoader) -> Any:
    """The set's first sample as a batch of one, batched as the loader batches (data.collate): for
    ranks whose own shard is shorter or empty."""
    whole = loader.dataset.dataset  # type: ignore[attr-defined]
    return next(iter(DataLoader(whole, batch_size=1, collate_fn=loader.collate_fn)))


@torch.no_grad()
def metric_names(model: nn.Module, loader: DataLoader, task: Task, device: torch.device) -> list[str]:
    """The figures a validation gives (val_<metric>), from one forward of one sample (on every rank:
    a sharded model's forward is a collective)."""
    was_training = model.training
    model.eval()
    inputs, targets, _, _ = one_sample(loader)
    names = list(task.metrics(model_forward(model, to_device(inputs, device)), to_device(targets, device)))
    model.train(was_training)
    return [f"val_{name}" for name in summarised(task, dict.fromkeys(names, 1.0))]

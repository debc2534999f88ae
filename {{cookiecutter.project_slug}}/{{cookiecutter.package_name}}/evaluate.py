"""Exact evaluation: every rank scores a disjoint, unpadded share; the sums are all-reduced.

The figures equal a one-process evaluation of the same weights at any world size, also when
the set size is not divisible by it (DistributedSampler would pad with repeated samples).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from .batch import model_forward, to_device
from .distributed import all_reduce_sum


@dataclass(frozen=True)
class EvalResult:
    metrics: dict[str, float]  # the task's metrics, each the mean over the whole set
    samples: int

    @property
    def loss(self) -> float:
        return self.metrics["loss"]

    def record(self) -> dict[str, Any]:
        """The figures as metrics.jsonl and the trackers take them: val_<name>, val_samples."""
        return {**{f"val_{name}": value for name, value in self.metrics.items()}, "val_samples": self.samples}

    def line(self) -> str:
        figures = " ".join(f"val_{name}={value:.6f}" for name, value in self.metrics.items())
        return f"{figures} val_samples={self.samples}"


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, task: Any, device: torch.device) -> EvalResult:
    """The task's metrics over the whole evaluation set, the same on every rank.

    Pass the unwrapped model: DDP's forward would broadcast buffers and expect every rank
    to run the same number of forwards, which uneven shards do not.
    """
    was_training = model.training
    model.eval()
    names: list[str] | None = None
    sums: torch.Tensor | None = None
    samples = torch.zeros((), dtype=torch.float64, device=device)
    for inputs, targets, _, _ in loader:
        inputs, targets = to_device(inputs, device), to_device(targets, device)
        values = task.metrics(model_forward(model, inputs), targets)
        if names is None:
            names = list(values)
            sums = torch.zeros(len(names), dtype=torch.float64, device=device)
        # float64 sums: the order of addition differs between world sizes, the result must not.
        sums += torch.stack([values[name].double().sum() for name in names])  # type: ignore[operator]
        samples += len(next(iter(values.values())))
    if names is None:  # this rank's shard is empty (more ranks than samples): learn the names
        names = sorted_metric_names(task, model, loader, device)
        sums = torch.zeros(len(names), dtype=torch.float64, device=device)
    all_reduce_sum(sums)  # type: ignore[arg-type]
    all_reduce_sum(samples)
    model.train(was_training)
    count = max(int(samples.item()), 1)
    return EvalResult(dict(zip(names, (total / count for total in sums.tolist()), strict=True)), int(samples.item()))  # type: ignore[union-attr]


def sorted_metric_names(task: Any, model: nn.Module, loader: DataLoader, device: torch.device) -> list[str]:
    """The metric names of a rank with no evaluation samples, from one sample of the full set."""
    inputs, targets, _, _ = next(iter(DataLoader(loader.dataset.dataset, batch_size=1)))  # type: ignore[attr-defined]
    values = task.metrics(model_forward(model, to_device(inputs, device)), to_device(targets, device))
    return list(values)

"""Exact evaluation: every rank scores a disjoint, unpadded share; the sums are all-reduced, so the figures
equal a one-process evaluation at any world size (docs/pitfalls.md). A task's epoch-level metrics come from
the whole set at once (docs/tasks.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..datasets.collate import model_forward, to_device
from ..tasks import Task
from .distributed.process_group import all_gather_int, all_gather_tensors, all_reduce_sum


@dataclass(frozen=True)
class EvalResult:
    metrics: dict[str, float]  # the task's metrics, each the mean over the whole set (its samples, or its items)
    samples: int
    nothing_counted: tuple[str, ...] = ()  # val_<name> of the figures NaN because their count was 0 everywhere
    tables: dict[str, Any] = field(default_factory=dict)  # epoch_metrics' tensors of more than one element, as lists

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
    """The task's metrics over the whole evaluation set, the same on every rank. Pass the unwrapped model: DDP's
    forward expects as many forwards on every rank, which uneven shards do not run. A sharded model's forward is
    a collective: `lockstep` pads the shorter shards with forwards of one sample whose figures are dropped."""
    was_training = model.training
    model.eval()
    sums: torch.Tensor | None = None  # per name: the values' (or the totals') sum, then their count
    samples = torch.zeros((), dtype=torch.float64, device=device)
    forwards = max(all_gather_int(len(loader), device)) if lockstep else len(loader)
    batches, epoch = iter(loader), EpochState.of(task)
    filler: Any = None  # a batch of the set's first sample, once this rank's shard has run out
    for _ in range(max(forwards, 1)):  # one forward at least: an empty shard learns the metric names
        batch = next(batches, None)
        if batch is None:  # this rank's shard is shorter (or empty): a filler forward, figures dropped
            filler = filler or one_sample(loader)
        inputs, targets, _, indices = batch if batch is not None else filler
        outputs, targets = model_forward(model, to_device(inputs, device)), to_device(targets, device)
        values = task.metrics(outputs, targets)
        if epoch is not None:
            epoch.add(outputs, targets, indices if batch is not None else None)
        if sums is None:
            names = list(values)
            sums = torch.zeros(2, len(names), dtype=torch.float64, device=device)
        if batch is not None:  # float64 sums: the order of addition varies with the world size, the result must not
            size = len(batch[2])  # its samples (their weights)
            sums += torch.stack([summed(values[name], size) for name in names], dim=1)
            samples += size
    assert sums is not None  # the loop ran once at least
    all_reduce_sum(sums)
    all_reduce_sum(samples)
    model.train(was_training)
    totals, counts = sums.tolist()
    means = {name: total / count if count else math.nan  # nothing counted: no figure (a 0 would rank best)
             for name, total, count in zip(names, totals, counts, strict=True)}  # fmt: skip
    figures = summarised(task, means)
    empty = tuple(f"val_{name}" for name, value in figures.items() if math.isnan(value)) if 0 in counts else ()
    if epoch is None:
        return EvalResult(figures, int(samples.item()), empty)
    more, tables = epoch.results(device)
    if clash := sorted(set(more) & set(figures)):
        raise ValueError(f"epoch_metrics and metrics both give {', '.join(clash)}: give them distinct names")
    return EvalResult({**figures, **more}, int(samples.item()), empty, tables)


def summed(value: Any, samples: int) -> torch.Tensor:
    """A metric's (sum, count) in float64: a (total, count) pair as it is, per-sample values over `samples`."""
    if isinstance(value, tuple):
        total, count = value
        return torch.stack([total.double(), torch.as_tensor(count, dtype=torch.float64, device=total.device)])
    return torch.stack([value.double().sum(), torch.tensor(float(samples), dtype=torch.float64, device=value.device)])


def summarised(task: Task, means: dict[str, float]) -> dict[str, float]:
    """The figures: the task's `summarise(means)` where it has one (bits per byte from the loss and the bytes per
    token), else the means."""
    summarise = getattr(task, "summarise", None)
    return summarise(means) if callable(summarise) else means


def one_sample(loader: DataLoader) -> Any:
    """The set's first sample as a batch of one, as the loader batches: for ranks whose shard is shorter or empty."""
    whole = loader.dataset.dataset  # type: ignore[attr-defined]
    return next(iter(DataLoader(whole, batch_size=1, collate_fn=loader.collate_fn)))


@torch.no_grad()
def metric_names(
    model: nn.Module, loader: DataLoader, task: Task, device: torch.device, sets: Iterable[str] = ()
) -> list[str]:
    """The figures a validation gives (val_<metric>, and val_<name>_<metric> of each of data.val_sets' `sets`),
    from one forward of one sample on every rank (a sharded model's forward is a collective)."""
    was_training = model.training
    model.eval()
    inputs, targets, _, indices = one_sample(loader)
    outputs, targets = model_forward(model, to_device(inputs, device)), to_device(targets, device)
    names = list(summarised(task, dict.fromkeys(task.metrics(outputs, targets), 1.0)))
    if (epoch := EpochState.of(task)) is not None:  # its figures over this one sample: their names
        epoch.add(outputs, targets, indices)
        names += list(epoch.results(device, across_ranks=False)[0])
    model.train(was_training)
    return [f"val_{name}" for name in names] + [f"val_{set_name}_{name}" for set_name in sets for name in names]


class EpochState:
    """What a task's `epoch_metrics` sees of the whole set: its `epoch_outputs` of every sample in sample order,
    its `epoch_sums` summed over every batch of every rank. Filler forwards only learn the names and shapes."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.kept: dict[str, list[torch.Tensor]] = {}  # this rank's per-sample values, batch by batch
        self.indices: list[torch.Tensor] = []
        self.empty: dict[str, torch.Tensor] = {}  # each value's shape with no sample: a set with none
        self.sums: dict[str, torch.Tensor] | None = None

    @staticmethod
    def of(task: Any) -> EpochState | None:
        return EpochState(task) if callable(getattr(task, "epoch_metrics", None)) else None

    def add(self, outputs: Any, targets: Any, indices: torch.Tensor | None) -> None:
        """A batch's share; `indices` None: a filler forward's, which adds nothing."""
        if callable(getattr(self.task, "epoch_outputs", None)):
            for name, value in self.task.epoch_outputs(outputs, targets).items():
                if indices is not None and len(value) != len(indices):
                    raise ValueError(f"epoch_outputs' {name!r} has {len(value)} rows for a batch of {len(indices)}: "
                                     "give one row per sample (tasks/__init__.py)")  # fmt: skip
                self.empty.setdefault(name, value.detach()[:0].cpu())
                if indices is not None:
                    self.kept.setdefault(name, []).append(value.detach())
            if indices is not None:
                self.indices.append(indices.cpu())
        if callable(getattr(self.task, "epoch_sums", None)):
            counted = {name: exact(value) for name, value in self.task.epoch_sums(outputs, targets).items()}
            self.sums = self.sums or {name: torch.zeros_like(value) for name, value in counted.items()}
            if indices is not None:
                for name, value in counted.items():
                    self.sums[name] += value

    def gathered(self, device: torch.device, across_ranks: bool) -> dict[str, torch.Tensor]:
        """Every sample's epoch_outputs, on the host, in sample order (by their set indices)."""
        indices = torch.cat(self.indices) if self.indices else torch.zeros(0, dtype=torch.int64)
        mine = {"indices": indices, "values": {name: torch.cat(parts).cpu() for name, parts in self.kept.items()}}
        pieces: list[dict[str, Any]] = all_gather_tensors(mine, device) if across_ranks else [mine]
        pieces = [piece for piece in pieces if len(piece["indices"])]  # a rank with no sample sends none
        if not pieces:
            return dict(self.empty)
        indices = torch.cat([piece["indices"] for piece in pieces])
        order = indices.argsort(stable=True)
        if across_ranks and len(indices.unique()) != len(indices):  # the figures would count a sample twice
            raise RuntimeError("an evaluation loader gave a sample twice: evaluate's loaders must be unpadded "
                               "disjoint shards (engine/data/sampler.py, eval_shard)")  # fmt: skip
        return {name: torch.cat([piece["values"][name] for piece in pieces])[order] for name in self.empty}

    def results(self, device: torch.device, across_ranks: bool = True) -> tuple[dict[str, float], dict[str, Any]]:
        """The task's epoch_metrics: its figures (numbers, 0-d tensors) and its tables (larger tensors, as lists)."""
        epoch = self.gathered(device, across_ranks) if self.empty or self.indices else {}
        for name, value in (self.sums or {}).items():
            epoch[name] = (all_reduce_sum(value) if across_ranks else value).cpu()
        figures, tables = {}, {}
        for name, value in self.task.epoch_metrics(epoch).items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                tables[name] = value.tolist()
            else:
                figures[name] = float(value)
        return figures, tables


def exact(value: torch.Tensor) -> torch.Tensor:
    """A count as it sums exactly: integers (and booleans) in int64, floats in float64."""
    return value.detach().double() if value.is_floating_point() else value.detach().long()

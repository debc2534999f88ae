"""The learning rate through the run: a linear warm-up to optim.lr, then the `scheduler` group's `_target_`.

Two kinds of scheduler, told apart by what they offer:
- the project's (Cosine, Constant) have `factor(fraction)`: the learning rate is optim.lr times the
  factor of the run's progress after the warm-up. Progress counts samples, in epochs, so the curve is
  the same at any world size, also after a resume on another; with trainer.max_steps it counts steps.
- any other (torch.optim.lr_scheduler.*, or the user's own: a callable taking the optimizer first, with
  step(), state_dict() and load_state_dict()) is stepped once per optimizer step after the warm-up,
  from optim.lr; its state is in the checkpoint (`scheduler`), so a resume continues it exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError
from .components import build

WARMUP_KEYS = ("warmup_epochs", "warmup_steps")  # the project's keys of the scheduler node


class Cosine:
    """Half a cosine from optim.lr down to 0 over the run after the warm-up."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        del optimizer  # a factor of progress: nothing to keep

    @staticmethod
    def factor(fraction: float) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * min(max(fraction, 0.0), 1.0)))


class Constant:
    """optim.lr from the warm-up's end to the run's."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        del optimizer

    @staticmethod
    def factor(fraction: float) -> float:
        return 1.0


@dataclass(frozen=True)
class RunLength:
    """How a run counts its progress: `total` units (epochs, or steps with trainer.max_steps), the
    first `warmup` of them a linear warm-up."""

    total: float
    warmup: float
    by_steps: bool

    @classmethod
    def of(cls, node: dict[str, Any], epochs: int, max_steps: int, steps_per_epoch: int) -> RunLength:
        """From the scheduler node and the trainer's counts; `steps_per_epoch` converts between them."""
        warmup_steps, warmup_epochs = node.get("warmup_steps", 0), node.get("warmup_epochs", 0.0)
        if max_steps:
            return cls(max_steps, warmup_steps or warmup_epochs * steps_per_epoch, by_steps=True)
        return cls(epochs, warmup_steps / steps_per_epoch if warmup_steps else warmup_epochs, by_steps=False)


class Schedule:
    """Sets each optimizer step's learning rate (before it) and steps the scheduler (after it)."""

    def __init__(self, node: dict[str, Any], optimizer: torch.optim.Optimizer, length: RunLength) -> None:
        self.optimizer, self.length = optimizer, length
        self.peaks = [group["lr"] for group in optimizer.param_groups]  # optim.lr, as the optimizer was built
        self.scheduler = build({k: v for k, v in node.items() if k not in WARMUP_KEYS}, "scheduler", optimizer)
        self.follows_progress = callable(getattr(self.scheduler, "factor", None))
        if not self.follows_progress and not all(
            callable(getattr(self.scheduler, name, None)) for name in ("step", "state_dict", "load_state_dict")
        ):
            raise ConfigError(
                f"scheduler._target_={node['_target_']} returned a {type(self.scheduler).__name__}, which has neither "
                "factor(fraction) nor step(), state_dict() and load_state_dict(): give a torch.optim.lr_scheduler class"
            )
        # A stepped scheduler's rates as it starts them (after the warm-up they continue from these).
        last_rates = getattr(self.scheduler, "get_last_lr", lambda: [g["lr"] for g in optimizer.param_groups])
        self.first_rates = [] if self.follows_progress else list(last_rates())
        self.started = False  # a stepped scheduler: whether the warm-up has handed over to it

    def before_step(self, done: float) -> None:
        """Set the learning rate of the optimizer step that brings the run to `done` units."""
        warmup, total = self.length.warmup, self.length.total
        if warmup > 0 and done < warmup:
            self.set([peak * done / warmup for peak in self.peaks])
        elif self.follows_progress:
            factor = self.scheduler.factor((done - warmup) / max(total - warmup, 1e-12))
            self.set([peak * factor for peak in self.peaks])
        elif not self.started:
            self.set(self.first_rates)
            self.started = True

    def after_step(self) -> None:
        if self.started:
            self.scheduler.step()

    def set(self, rates: list[float]) -> None:
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's `scheduler`: a stepped scheduler's state (the project's have none)."""
        state = {} if self.follows_progress else self.scheduler.state_dict()
        return {"scheduler": {"started": self.started, "state": state}}

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        saved = payload.get("scheduler") or {"started": False, "state": {}}  # older checkpoints: none kept
        self.started = saved["started"]
        if saved["state"] and not self.follows_progress:
            self.scheduler.load_state_dict(saved["state"])

"""The learning rate through the run: a linear warm-up to optim.lr, then the `scheduler` group's `_target_`:
the project's (a `factor(fraction)` of the run's progress) or a stepped one (torch.optim.lr_scheduler's), and
what a resume that changes them does (docs/recipe.md).
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..common.errors import ConfigError
from ..config.compatibility import differences, listed, under
from ..config.targets import build

log = logging.getLogger(__name__)

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
    """A run's progress: `total` units (epochs, or steps with trainer.max_steps), the first `warmup` a warm-up."""

    total: float
    warmup: float
    by_steps: bool

    @classmethod
    def of(cls, node: dict[str, Any], epochs: int, max_steps: int, steps_per_epoch: int) -> RunLength:
        warmup_steps, warmup_epochs = node.get("warmup_steps", 0), node.get("warmup_epochs", 0.0)
        if max_steps:
            return cls(max_steps, warmup_steps or warmup_epochs * steps_per_epoch, by_steps=True)
        return cls(epochs, warmup_steps / steps_per_epoch if warmup_steps else warmup_epochs, by_steps=False)


class Schedule:
    """Sets each step's learning rate and steps the scheduler. `accepted`: checkpoint.allow_changes."""

    def __init__(self, node: dict[str, Any], optimizer: torch.optim.Optimizer, length: RunLength,
                 accepted: Sequence[str] = ()) -> None:  # fmt: skip
        self.node, self.optimizer, self.length, self.accepted = node, optimizer, length, list(accepted)
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
        self.needs_metric = not self.follows_progress and takes_an_argument(self.scheduler.step)
        # The optimizer's settings as the config gives them (a resume brings back the checkpoint's).
        self.settings = [{k: v for k, v in g.items() if k not in ("params", "lr")} for g in optimizer.param_groups]

    def check_monitor(self, key: str, mode: str) -> None:
        """A scheduler stepped with checkpoint.monitor's figure must rank it as the monitor does."""
        own = getattr(self.scheduler, "mode", mode)
        if self.needs_metric and own != mode:
            raise ConfigError(
                f"scheduler._target_={self.node['_target_']} has mode={own}, but it is stepped with "
                f"checkpoint.monitor={key}, which checkpoint.mode={mode} ranks: give +scheduler.mode={mode}"
            )

    def warmup_outlasts_run(self) -> str:
        """A warning where the warm-up is longer than the run (the rate never reaches optim.lr); "" if not."""
        warmup, total = self.length.warmup, self.length.total
        if warmup <= total:
            return ""
        unit, of = ("steps", "trainer.max_steps") if self.length.by_steps else ("epochs", "trainer.epochs")
        return (
            f"the warm-up ({warmup:.3g} {unit}) is longer than the run ({of}={total:g}): the learning rate ends at "
            f"{total / warmup:.2g} of optim.lr and never reaches it; shorten scheduler.warmup_steps or "
            f"warmup_epochs, or train longer"
        )

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
        if self.started and not self.needs_metric:
            self.scheduler.step()

    def after_validation(self, figure: float) -> None:
        """A scheduler that needs a figure (ReduceLROnPlateau) takes checkpoint.monitor's, after the warm-up."""
        if self.started and self.needs_metric:
            self.scheduler.step(figure)

    def set(self, rates: list[float]) -> None:
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's `scheduler`: a stepped scheduler's state (the project's have none)."""
        state = {} if self.follows_progress else self.scheduler.state_dict()
        return {"scheduler": {"started": self.started, "state": state}}

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        for group, settings in zip(self.optimizer.param_groups, self.settings, strict=True):
            group.update(settings)  # the config's weight_decay, momentum, ...: not the checkpoint's
        saved = payload.get("scheduler") or {"started": False, "state": {}}  # older checkpoints: none kept
        if not saved["started"] or self.follows_progress:
            return  # nothing to continue: a stepped scheduler not handed over to yet is as newly built
        changed = self.changed_settings(payload.get("config") or {})
        refused = [key for key in changed if not under(key, self.accepted)]
        if refused:
            raise ConfigError(
                f"the checkpoint's scheduler was stepped with other settings ({listed(changed, refused)}): its saved "
                "state would override them. Resume with the checkpoint's values, give a new run dir (RUN_DIR, or "
                "RUN_NAME on many nodes), or accept them, the scheduler starting afresh from them at this step: "
                f"checkpoint.allow_changes=[{','.join(refused)}]"
            )
        if changed:
            log.info("scheduler: %s changed (accepted by checkpoint.allow_changes): %s starts afresh from the new "
                     "settings at step %s, its saved state not loaded", ", ".join(changed), self.node["_target_"],
                     payload.get("step"))  # fmt: skip
            return
        self.started = True
        if saved["state"]:
            self.scheduler.load_state_dict(saved["state"])

    def changed_settings(self, saved_config: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """{key: (checkpoint's, config's)} of optim.lr and the scheduler group (no config saved: none changed)."""
        if "scheduler" not in saved_config:
            return {}
        old, new = {"scheduler": saved_config["scheduler"]}, {"scheduler": dict(self.node)}
        if "lr" in (saved_config.get("optim") or {}):
            old["optim"], new["optim"] = {"lr": saved_config["optim"]["lr"]}, {"lr": self.peaks[0]}
        return differences(old, new)


def takes_an_argument(method: Any) -> bool:
    """Whether a scheduler's step() needs an argument (ReduceLROnPlateau's step(metrics))."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: stepped as torch's are
        return False
    return any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)

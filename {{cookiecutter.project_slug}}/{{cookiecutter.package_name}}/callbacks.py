"""Your callbacks: logic at the events engine/callbacks.py lists, named in the config by `_target_`. These
three are docs/callbacks.md's examples, which says what each event's `run` offers."""

from __future__ import annotations

from typing import Any

from torch import nn


class FreezeUntil:
    """Freeze the parameters whose names start with one of `prefixes` (a backbone) for the first `step`
    optimizer steps, then train them. `freezes_parameters`: ddp.find_unused_parameters is turned on."""

    freezes_parameters = True

    def __init__(self, step: int, prefixes: list[str]) -> None:
        self.step, self.prefixes = step, tuple(prefixes)
        self.frozen: bool | None = None

    def on_train_start(self, run: Any) -> None:
        names = [name for name, _ in run.model.named_parameters() if name.startswith(self.prefixes)]
        if not names:
            raise ValueError(f"no parameter's name starts with any of {list(self.prefixes)}")
        self.on_step_start(run)

    def on_step_start(self, run: Any) -> None:
        frozen = run.step < self.step  # the step about to run is run.step + 1
        if frozen != self.frozen:  # only when it changes: nothing per step
            for name, parameter in run.model.named_parameters():
                if name.startswith(self.prefixes):
                    parameter.requires_grad_(not frozen)
            self.frozen = frozen


class LogWeightNorm:
    """Log the global norm of the weights every `every` steps, as `weights/norm`."""

    def __init__(self, every: int) -> None:
        self.every = every

    def on_step_end(self, run: Any) -> None:
        if run.step % self.every == 0:
            norm = nn.utils.get_total_norm([parameter.detach() for parameter in run.model.parameters()])
            if hasattr(norm, "full_tensor"):  # sharded weights: every rank's shards (a collective)
                norm = norm.full_tensor()
            run.log("weights/norm", norm)


class SecondValidation:
    """Evaluate the model on another data set every `every` steps and log its figures as `<name>/<metric>`.
    `dataset`: a map-style data set, or a (train, val) pair whose val set is used."""

    def __init__(self, every: int, dataset: Any, name: str = "val2") -> None:
        self.every, self.name = every, name
        self.dataset = dataset[1] if isinstance(dataset, tuple | list) else dataset

    def on_step_end(self, run: Any) -> None:
        if run.step % self.every == 0:
            for metric, value in run.evaluate(self.dataset).items():
                run.log(f"{self.name}/{metric}", value)


# What a checkpoint's config may build (engine/checkpoint/trust.py): add a callback of yours here.
BUILDABLE = (FreezeUntil, LogWeightNorm, SecondValidation)

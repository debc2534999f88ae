"""Your callbacks: logic at a step's start or end, after a validation, at the run's start or end,
named in the config by `_target_` (docs/callbacks.md), e.g.

    python -m {{ cookiecutter.package_name }}.train +callbacks.freeze._target_={{ cookiecutter.package_name }}.callbacks.FreezeUntil \
        +callbacks.freeze.step=100 '+callbacks.freeze.prefixes=[blocks.0.]'

A callback defines the events it wants (engine/callbacks.py lists them); each gets `run`: run.step,
run.epoch, run.model (unwrapped), run.optimizer, run.rank, run.world_size, run.run_dir, run.log(name,
value), run.evaluate(dataset). These three are the docs' examples, each tested (tests/test_callbacks.py).
"""

from __future__ import annotations

from typing import Any

from torch import nn


class FreezeUntil:
    """Freeze the parameters whose names start with one of `prefixes` (a backbone) for the first `step`
    optimizer steps, then train them. A frozen parameter gets no gradient, so the optimizer leaves it,
    its momentum and its weight decay alone. Under ddp this needs DDP to find unused parameters:
    `freezes_parameters` tells the engine to turn ddp.find_unused_parameters on (engine/assembly/build.py)."""

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
    """Log the global norm of the weights every `every` steps, as `weights/norm`: a figure of your own."""

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
    `dataset` is a node with its `_target_` (built for you): a map-style data set, or a (train, val) pair
    as data.dataset's `_target_` returns, of which the val set is used. The figures are exact, and the
    same at any world size: every rank evaluates its share, as the validation does."""

    def __init__(self, every: int, dataset: Any, name: str = "val2") -> None:
        self.every, self.name = every, name
        self.dataset = dataset[1] if isinstance(dataset, tuple | list) else dataset

    def on_step_end(self, run: Any) -> None:
        if run.step % self.every == 0:
            for metric, value in run.evaluate(self.dataset).items():
                run.log(f"{self.name}/{metric}", value)


# What a checkpoint's config may build (engine/checkpoint/trust.py): a callback of yours here, named by no config
# file, is added to it; anything of the package not listed is refused.
BUILDABLE = (FreezeUntil, LogWeightNorm, SecondValidation)

"""Callbacks: the config's `callbacks` (name -> node with `_target_`), built once, called at five events with
`run` (a Run); every rank's state in every checkpoint. docs/callbacks.md says when each event runs and what
it may do.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..common.errors import ConfigError, JobError, Preempted, first_line
from ..common.placement import DistEnv
from ..config.targets import build, describe
from .data.loader import eval_loader
from .distributed.process_group import all_gather_bytes

log = logging.getLogger(__name__)

EVENTS = ("on_train_start", "on_step_start", "on_step_end", "on_validation_end", "on_train_end")


class Run:
    """What a callback sees: views of the trainer, read when asked (nothing is built per step)."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer
        self.model: torch.nn.Module = trainer.model  # unwrapped: no DDP, no torch.compile
        self.optimizer: torch.optim.Optimizer = trainer.optimizer
        self.rank, self.world_size = trainer.env.rank, trainer.env.world_size
        self.device: torch.device = trainer.env.device
        self.run_dir: Path = trainer.run_dir
        self.config = trainer.config
        self.caller: str | None = None  # the key of the callback whose event runs (Callbacks.fire)
        self._order = list(trainer.callbacks.named)  # the config's order: the first keeps a shared figure's name
        self._figures: dict[str, str] = {}  # a figure's name -> the callback that logs it so
        self._loaders: dict[int, tuple[Any, torch.utils.data.DataLoader]] = {}  # run.evaluate's, by data set

    @property
    def step(self) -> int:
        """Optimizer steps done (the one running, in on_step_start, is step + 1)."""
        return self._trainer.state.step

    @property
    def epoch(self) -> int:
        return self._trainer.state.epoch

    def log(self, name: str, value: float | torch.Tensor) -> None:
        """A figure of this step, rank 0's value, to metrics.jsonl and the sinks (docs/callbacks.md)."""
        name = self.figure_name(name if "/" in name else f"callbacks/{name}")
        if self._trainer.metrics.enabled:
            self._trainer.metrics.write("callback", step=self.step, epoch=self.epoch, **{name: float(value)})

    def figure_name(self, name: str) -> str:
        """A figure's name as logged: of two callbacks logging one name, the later in the config logs `<name>/<key>`."""
        caller = self.caller
        if caller is None:  # not from an event: as given
            return name
        holder = self._figures.setdefault(name, caller)
        if holder == caller:
            return name
        if self._order.index(caller) < self._order.index(holder):  # after a resume the later one may log first
            self._figures[name] = caller
            return name
        return f"{name}/{caller}"

    def evaluate(self, dataset: Any) -> dict[str, float]:
        """The task's metrics over a map-style data set, as the validation evaluates: a collective (every rank)."""
        if id(dataset) not in self._loaders:  # built once (its workers too); the data set kept alive with it
            loader = eval_loader(dataset, self.config.data, self._trainer.env, self.config.seed)
            self._loaders[id(dataset)] = (dataset, loader)
        return self._trainer.validate(self._loaders[id(dataset)][1]).metrics


class Callbacks:
    """The built callbacks, by event; an empty one costs the loop a test of an empty list per event."""

    def __init__(self, named: Mapping[str, Any]) -> None:
        self.named = dict(named)
        self.hooks = {event: [(name, getattr(cb, event)) for name, cb in self.named.items() if hasattr(cb, event)]
                      for event in EVENTS}  # fmt: skip
        self.step_start, self.step_end = self.hooks["on_step_start"], self.hooks["on_step_end"]
        self.run: Run | None = None

    def fire(self, event: str, *args: Any) -> None:
        """Call every callback's `event`; one that raises stops the run with one line naming it."""
        for name, hook in self.hooks[event]:
            if self.run is not None:
                self.run.caller = name
            try:
                hook(self.run, *args)
            except (JobError, ConfigError, Preempted):
                raise
            except Exception as error:
                raise JobError(f"callbacks.{name}.{event} raised {first_line(error)}: fix it or remove it") from error
            finally:
                if self.run is not None:
                    self.run.caller = None

    def stateful(self) -> dict[str, Any]:
        return {name: cb for name, cb in self.named.items() if hasattr(cb, "state_dict")}


def build_callbacks(config: Mapping[str, Any]) -> Callbacks:
    """Each `callbacks.<name>` built from its `_target_` (one line naming the key where it fails)."""
    return Callbacks({name: build(node, f"callbacks.{name}") for name, node in (config or {}).items()})


class CallbackStates:
    """The checkpoint's `callbacks`: every rank's {name: state_dict()}, gathered in rank order."""

    def __init__(self, callbacks: Callbacks, env: DistEnv) -> None:
        self.callbacks, self.env = callbacks, env

    def state_dict(self) -> dict[str, Any]:
        buffer = io.BytesIO()
        torch.save({name: checked_state(name, cb) for name, cb in self.callbacks.stateful().items()}, buffer)
        gathered = all_gather_bytes(buffer.getvalue(), self.env.device)
        return {"callbacks": [torch.load(io.BytesIO(data), weights_only=True) for data in gathered]}

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        """This rank's saved states (rank 0's at another world size); a callback without one starts afresh."""
        saved = payload.get("callbacks")
        if not saved:
            return
        same_world = len(saved) == self.env.world_size
        if not same_world:
            log.info("callbacks' states saved by %d processes, now %d: every rank takes rank 0's", len(saved),
                     self.env.world_size)  # fmt: skip
        mine = saved[self.env.rank] if same_world else saved[0]
        for name, cb in self.callbacks.stateful().items():
            if name in mine and hasattr(cb, "load_state_dict"):
                try:
                    cb.load_state_dict(mine[name])
                except (JobError, ConfigError):
                    raise
                except Exception as error:
                    raise JobError(f"callbacks.{name}.load_state_dict raised {first_line(error)} on the checkpoint's "
                                   "state: fix it or remove it", exit_code=2) from error  # fmt: skip
            else:
                log.info("callbacks.%s: the checkpoint holds no state of it; it starts afresh", name)


PLAIN = "it must return a dict of tensors and plain values (numbers, strings, lists, dicts): fix it or remove it"


def checked_state(name: str, callback: Any) -> dict[str, Any]:
    """A callback's state_dict(), as a checkpoint loads it (weights_only); else a JobError naming it, exit code 2
    (the user's code: a restart would only repeat it)."""
    try:
        state = callback.state_dict()
    except (JobError, ConfigError, Preempted):
        raise
    except Exception as error:
        raise JobError(f"callbacks.{name}.state_dict raised {first_line(error)}: fix it or remove it",
                       exit_code=2) from error  # fmt: skip
    if not isinstance(state, dict):
        raise JobError(f"callbacks.{name}.state_dict returned {describe(state)}: {PLAIN}", exit_code=2)
    buffer = io.BytesIO()
    try:
        torch.save(state, buffer)
        buffer.seek(0)
        return torch.load(buffer, map_location="cpu", weights_only=True)  # a copy, as the checkpoint keeps it
    except Exception as error:
        odd = re.search(r"GLOBAL (\S+)", str(error))  # weights_only's refusal names the class it met
        what = odd.group(1).rsplit(".", 1)[-1] if odd else first_line(error)
        raise JobError(f"callbacks.{name}.state_dict returned a value that is not a tensor or a plain value "
                       f"({what}): {PLAIN}", exit_code=2) from None  # fmt: skip

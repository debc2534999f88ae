"""Where training stands; whether a run at such a state has finished is config/compatibility.py's run_finished."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# The trainer's question, a pure rule below the engine; it stays importable from here.
from ..config.compatibility import run_finished  # noqa: F401


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

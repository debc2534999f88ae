"""Where training stands: with the model and the optimizer, what continues a run bit-exactly; and
whether a run at such a state has trained all it will (the loop asks, and so does a resume's check)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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


def run_finished(payload: dict[str, Any], epochs: int, max_steps: int) -> bool:
    """Whether a run at this state (a checkpoint's payload, or the trainer's) has trained all it will:
    stopped early, at trainer.max_steps where set, else after its trainer.epochs whole epochs."""
    if (payload.get("monitor") or {}).get("stopped"):
        return True
    if max_steps:
        return payload.get("step", 0) >= max_steps
    return payload.get("epoch", 0) >= epochs and payload.get("samples_in_epoch", 0) == 0

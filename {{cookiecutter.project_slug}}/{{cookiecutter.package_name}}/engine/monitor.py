"""The monitored validation figure, `checkpoint.monitor`: which checkpoints are the best (`checkpoint.keep_best`)
and when a run has stopped improving (`trainer.early_stop_patience`); docs/recipe.md. Every rank observes the
same exact figures, so every rank decides alike at the same step: an early stop needs no collective.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from ..common.errors import ConfigError
from ..config import CheckpointConfig, TrainerConfig

log = logging.getLogger(__name__)


@dataclass
class Monitor:
    key: str  # val_<metric>, as metrics.jsonl names it
    mode: str  # min | max
    keep_best: int
    patience: int  # 0: no early stopping
    min_delta: float
    best: list[tuple[int, float]] = field(default_factory=list)  # (step, value), best first
    reference: float | None = None  # the value of the last improvement (by more than min_delta)
    bad: int = 0  # validations since that improvement
    not_finite: int = 0  # of those, the ones whose figure was not finite (NaN, inf)
    stopped: str = ""  # why the run stopped early; "" while it has not

    @classmethod
    def of(cls, checkpoint: CheckpointConfig, trainer: TrainerConfig) -> Monitor:
        return cls(checkpoint.monitor, checkpoint.mode, checkpoint.keep_best, trainer.early_stop_patience,
                   trainer.early_stop_min_delta)  # fmt: skip

    @property
    def enabled(self) -> bool:
        return self.keep_best > 0 or self.patience > 0

    def check_names(self, names: list[str]) -> None:
        """Refuse a monitor the task's validation does not give (`names`: val_<metric> of one forward)."""
        if self.key not in names:
            raise ConfigError(
                f"checkpoint.monitor={self.key} is not a figure of this task's validation, which gives "
                f"{', '.join(names)}: give one of them"
            )

    def better(self, value: float, than: float, margin: float = 0.0) -> bool:
        return value < than - margin if self.mode == "min" else value > than + margin

    def observe(self, step: int, record: dict[str, Any]) -> bool:
        """Take a validation's figures at step `step`; whether that step's checkpoint is now one of the best."""
        if not self.enabled:
            return False
        value = float(record[self.key])
        finite = math.isfinite(value)
        if finite and (self.reference is None or self.better(value, self.reference, self.min_delta)):
            self.reference, self.bad, self.not_finite = value, 0, 0
        else:
            self.bad, self.not_finite = self.bad + 1, self.not_finite + (not finite)
        if finite:
            others = [entry for entry in self.best if entry[0] != step]
            ranked = sorted([*others, (step, value)], key=lambda e: e[1] if self.mode == "min" else -e[1])
            self.best = ranked[: max(self.keep_best, 1)]  # sorted() is stable: of equal values the earlier wins
        if self.patience and self.bad >= self.patience:
            top = f"{self.best[0][1]:.6g} at step {self.best[0][0]}" if self.best else "none finite"
            nan = f"; {self.not_finite} of them NaN or infinite" if self.not_finite else ""
            self.stopped = (
                f"{self.key} has not improved for {self.bad} validations (patience {self.patience}; best {top}{nan})"
            )
        return self.keep_best > 0 and finite and any(entry[0] == step for entry in self.best)

    def kept_steps(self) -> list[int]:
        """The steps whose checkpoints keep_best keeps, best first."""
        return [step for step, _ in self.best] if self.keep_best else []

    def state_dict(self) -> dict[str, Any]:
        return {"monitor": {"best": [list(entry) for entry in self.best], "reference": self.reference,
                            "bad": self.bad, "not_finite": self.not_finite, "stopped": self.stopped}}  # fmt: skip

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        saved = payload.get("monitor") or {}  # older checkpoints: none kept
        self.best = [(int(step), float(value)) for step, value in saved.get("best", [])][: max(self.keep_best, 1)]
        self.reference, self.bad, self.stopped = saved.get("reference"), saved.get("bad", 0), saved.get("stopped", "")
        self.not_finite = saved.get("not_finite", 0)
        if not self.stopped:  # a run that stopped early ranks nothing more: its best stay as they were
            self.start_afresh_where_changed((payload.get("config") or {}).get("checkpoint") or {}, payload.get("step"))

    def start_afresh_where_changed(self, saved: dict[str, Any], step: int | None) -> None:
        """Against the checkpoint's `checkpoint` settings: a changed monitor or mode (whose old figures are not
        comparable) ranks and counts afresh; keep_best switched on ranks afresh."""
        key, mode = saved.get("monitor", self.key), saved.get("mode", self.mode)
        if (key, mode) != (self.key, self.mode) and self.enabled:
            self.best, self.reference, self.bad, self.not_finite = [], None, 0, 0
            log.info("checkpoint.monitor changed (%s, %s -> %s, %s): the best checkpoints and the early-stopping count "
                     "start afresh after step %s; the earlier best are no longer kept as best", key, mode, self.key,
                     self.mode, step)  # fmt: skip
        elif saved.get("keep_best", self.keep_best) == 0 and self.keep_best and self.best:
            self.best = []  # ranked while keep_best was off: no checkpoint was kept for them
            log.info("checkpoint.keep_best switched on: the best checkpoints are ranked from the validations after "
                     "step %s (none was kept before)", step)  # fmt: skip

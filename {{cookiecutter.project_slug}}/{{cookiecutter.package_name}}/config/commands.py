"""The schemas of the commands that read a checkpoint beyond eval.py's (EvalConfig, schema.py): their own
keys over the checkpoint's config. Registered for the configs/<command>.yaml files (compose.py)."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from .schema import EvalConfig
from .values import require_choice

PREDICT_SPLITS = ("val", "train")  # the data set's sets predict.py runs the model over


@dataclass
class PredictConfig(EvalConfig):
    out: str = MISSING  # the file predict.py writes (it must not exist)
    split: str = "val"
    predict_as: str | None = None  # what the task turns outputs into (tasks/__init__.py); None: its default

    def check(self) -> None:
        super().check()
        require_choice("split", self.split, PREDICT_SPLITS)

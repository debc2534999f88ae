"""Tasks: what a batch's loss is and what evaluation reports.

A task is any object with two methods, chosen by `task._target_`:

- `loss(outputs, targets)`: one loss per sample, shape (batch,). Training weights them (padding
  of the last, short batch has weight 0) and averages over exactly the real samples.
- `metrics(outputs, targets)`: a dict of per-sample values, each of shape (batch,). Evaluation
  sums them in float64 over the whole set, across ranks, and divides by the number of samples:
  the figures equal a one-process evaluation's at any world size. They are reported as
  `val_<name>`; the first one (by convention `loss`) is the validation loss.

Outputs are what the model returns; targets what the data set's items carry after the input.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F


@runtime_checkable
class Task(Protocol):
    """What `task._target_` builds: the two methods above. Any object that has them is a task."""

    def loss(self, outputs: Any, targets: Any) -> torch.Tensor:
        """One loss per sample, shape (batch,)."""
        ...

    def metrics(self, outputs: Any, targets: Any) -> dict[str, torch.Tensor]:
        """Per-sample values by name, each of shape (batch,); the first is the validation loss."""
        ...


class Classification:
    """Cross-entropy over classes; val_loss and val_acc."""

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels, reduction="none")

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.loss(logits, labels), "acc": (logits.argmax(dim=1) == labels).float()}


class LanguageModel:
    """Next-token cross-entropy; val_loss in nats per token (per byte for the byte-level model)
    and val_bpb, bits per byte (the same loss in bits: a byte is a token here)."""

    def loss(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        per_token = F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten(), reduction="none")
        return per_token.view(tokens.shape).mean(dim=1)  # every sequence has the same length

    def tokens_per_sample(self, tokens: torch.Tensor) -> int:
        """A sample's tokens (its sequence length): the log line's tokens_per_s (observe/figures.py)."""
        return tokens.shape[-1]

    def metrics(self, logits: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = self.loss(logits, tokens)
        return {"loss": loss, "bpb": loss / math.log(2)}

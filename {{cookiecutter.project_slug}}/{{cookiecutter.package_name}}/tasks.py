"""Tasks: what a batch's loss is and what evaluation reports.

A task is any object with two methods, chosen by `task._target_`:

- `loss(outputs, targets)`: one loss per sample, shape (batch,). Training weights them (padding
  of the last, short batch has weight 0) and averages over exactly the real samples.
- `metrics(outputs, targets)`: a dict of per-sample values, each of shape (batch,). Evaluation
  sums them in float64 over the whole set, across ranks, and divides by the number of samples:
  the figures equal a one-process evaluation's at any world size. They are reported as
  `val_<name>`; the first one (by convention `loss`) is the validation loss.
- optionally `summarise(means)`: the figures reported, from those means (a ratio of two sums over the
  whole set: LanguageModel's bits per byte); without it, the means are the figures.

Outputs are what the model returns; targets what the data set's items carry after the input.

Optionally, what predict.py saves of the outputs: `predict(outputs, kind)` returns a tensor whose first
dimension is the batch's, and `predictions` names the kinds it takes (`predict_as=<kind>`), the first
one the default. A task without them has the model's outputs saved as they are (a tensor).
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from .datasets.tokenizer import of_folder


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
    """Cross-entropy over classes; val_loss and val_acc. Predictions: the logits, their softmax
    (`predict_as=probs`) or the class ids (`predict_as=class`, int64)."""

    predictions = ("logits", "probs", "class")

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels, reduction="none")

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.loss(logits, labels), "acc": (logits.argmax(dim=1) == labels).float()}

    def predict(self, logits: torch.Tensor, kind: str) -> torch.Tensor:
        return predicted(logits, kind, dim=1)


class LanguageModel:
    """Next-token cross-entropy; val_loss in nats per token and val_bpb in bits per byte of text.

    Over bytes a token is a byte, and val_bpb is val_loss in bits. Over a BPE's tokens (`vocab_from`: a
    token folder of prepare tokens, which data=tokens passes; a key named `tokens` would be redacted as a
    secret in checkpoints) val_bpb is the bits of every validation window's targets over the bytes of text
    they stand for (the tokenizer's), summed over the whole set: it compares with a byte model's figure.
    Predictions, at each position: the logits, their softmax (`predict_as=probs`) or the likeliest next
    token (`predict_as=token`).
    """

    predictions = ("logits", "probs", "token")

    def __init__(self, vocab_from: str | None = None) -> None:
        self.token_bytes: torch.Tensor | None = None  # bytes per id; None: every token is one byte
        if vocab_from is not None:
            tokenizer = of_folder(vocab_from)
            if tokenizer.kind != "bytes":
                self.token_bytes = torch.tensor(tokenizer.token_bytes(), dtype=torch.float64)

    def loss(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        per_token = F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten(), reduction="none")
        return per_token.view(tokens.shape).mean(dim=1)  # every sequence has the same length

    def tokens_per_sample(self, tokens: torch.Tensor) -> int:
        """A sample's tokens (its sequence length): the log line's tokens_per_s (observe/figures.py)."""
        return tokens.shape[-1]

    def metrics(self, logits: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = self.loss(logits, tokens)
        if self.token_bytes is None:
            return {"loss": loss, "bpb": loss / math.log(2)}
        self.token_bytes = self.token_bytes.to(tokens.device)
        # A window's bits and its bytes: summed over the set by evaluation, divided by summarise.
        return {"loss": loss, "bits": loss.double() * tokens.shape[1] / math.log(2),
                "bytes": self.token_bytes[tokens].sum(dim=1)}  # fmt: skip

    def summarise(self, means: dict[str, float]) -> dict[str, float]:
        """val_bpb of a BPE: all the windows' bits over all their bytes (the means' ratio is the sums')."""
        if "bytes" not in means:
            return means
        return {"loss": means["loss"], "bpb": means["bits"] / means["bytes"]}

    def predict(self, logits: torch.Tensor, kind: str) -> torch.Tensor:
        return predicted(logits, kind, dim=-1)


def predicted(logits: torch.Tensor, kind: str, dim: int) -> torch.Tensor:
    """The logits as they are, their softmax over `dim` (in float32), or their argmax (int64)."""
    if kind == "logits":
        return logits
    if kind == "probs":
        return F.softmax(logits.float(), dim=dim)
    return logits.argmax(dim=dim)

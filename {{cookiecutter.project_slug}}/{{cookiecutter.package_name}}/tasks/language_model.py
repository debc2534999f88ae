"""The language model's task (`task=language_model`; configs and checkpoints name it `tasks.LanguageModel`):
next-token cross-entropy over every real token of the global batch."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from ..datasets.tokenizer import of_folder
from . import IGNORE, predicted

# What task=language_model's config offers a task of yours under it beside its own arguments
# (engine/assembly/components.py): data=tokens's folder.
OFFERED = ("vocab_from",)


class LanguageModel:
    """Next-token cross-entropy, token-weighted: the step's loss is the mean over every real token of
    the global batch (a pair (total, count)), so windows of different lengths (padded by
    datasets.collate.pad_windows, targets IGNORE where padded) weigh by their tokens. val_loss in nats
    per token and val_bpb in bits per byte of text, over every token of the set.

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

    def loss(self, logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the cross-entropy summed over the real target tokens, their number)."""
        total = F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten(), reduction="sum", ignore_index=IGNORE)
        return total, (tokens != IGNORE).sum()

    def tokens_per_sample(self, tokens: torch.Tensor) -> int:
        """A sample's tokens (its sequence length): the log line's tokens_per_s (observe/figures.py)."""
        return tokens.shape[-1]

    def metrics(self, logits: torch.Tensor, tokens: torch.Tensor) -> dict[str, Any]:
        # Summed in float64: a batch's total must not depend on which windows share the batch (world size).
        per_token = F.cross_entropy(
            logits.float().flatten(0, 1), tokens.flatten(), reduction="none", ignore_index=IGNORE
        )
        total, count = per_token.double().sum(), (tokens != IGNORE).sum()
        if self.token_bytes is None:
            return {"loss": (total, count), "bpb": (total / math.log(2), count)}
        self.token_bytes = self.token_bytes.to(tokens.device)
        real = tokens != IGNORE
        # The tokens' bits and their bytes, each over the same count: their means' ratio is their sums'.
        return {"loss": (total, count), "bits": (total / math.log(2), count),
                "bytes": ((self.token_bytes[tokens.clamp_min(0)] * real).sum(), count)}  # fmt: skip

    def summarise(self, means: dict[str, float]) -> dict[str, float]:
        """val_bpb of a BPE: all the windows' bits over all their bytes (the means' ratio is the sums')."""
        if "bytes" not in means:
            return means
        return {"loss": means["loss"], "bpb": means["bits"] / means["bytes"]}

    def predict(self, logits: torch.Tensor, kind: str) -> torch.Tensor:
        return predicted(logits, kind, dim=-1)


BUILDABLE = (LanguageModel,)

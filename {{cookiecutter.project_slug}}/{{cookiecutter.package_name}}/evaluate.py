"""Exact evaluation: every rank scores a disjoint, unpadded share; the sums are all-reduced.

The figures equal a one-process evaluation of the same weights at any world size, also when
the set size is not divisible by it (DistributedSampler would pad with repeated samples).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from .distributed import all_reduce_sum


@dataclass(frozen=True)
class EvalResult:
    loss: float
    accuracy: float
    samples: int

    def line(self) -> str:
        return f"val_loss={self.loss:.6f} val_acc={self.accuracy:.6f} val_samples={self.samples}"


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> EvalResult:
    """Mean loss and accuracy over the whole evaluation set, the same on every rank.

    Pass the unwrapped model: DDP's forward would broadcast buffers and expect every rank
    to run the same number of forwards, which uneven shards do not.
    """
    was_training = model.training
    model.eval()
    # float64 sums: the order of addition differs between world sizes, the result must not.
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, samples
    for images, labels, _, _ in loader:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        logits = model(images).float()
        totals[0] += F.cross_entropy(logits, labels, reduction="none").double().sum()
        totals[1] += (logits.argmax(dim=1) == labels).sum()
        totals[2] += labels.numel()
    all_reduce_sum(totals)
    model.train(was_training)
    loss_sum, correct, samples = totals.tolist()
    return EvalResult(loss=loss_sum / max(samples, 1), accuracy=correct / max(samples, 1), samples=int(samples))

"""Tasks: what a batch's loss is and what evaluation reports. A task (`task._target_`) has `loss` and `metrics`
(Task); optionally `summarise`, `epoch_outputs`, `epoch_sums`, `epoch_metrics` (figures of the whole set), and
`predict(outputs, kind)` with `predictions` (what predict.py saves). docs/tasks.md says what each form means.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..common.registry import buildable_beside, defined_beside


@runtime_checkable
class Task(Protocol):
    """What `task._target_` builds: any object with these two methods."""

    def loss(self, outputs: Any, targets: Any) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """One loss per sample, shape (batch,); or (total, count): the items' summed loss and their number."""

    def metrics(self, outputs: Any, targets: Any) -> dict[str, Any]:
        """Per-sample values (batch,) or (total, count) pairs by name; the first is the validation loss."""


class Classification:
    """Cross-entropy; val_loss, val_acc, val_macro_f1 and a confusion matrix (rows: true class, columns: predicted).
    Predictions: the logits, their softmax (`predict_as=probs`) or the class ids (`predict_as=class`, int64)."""

    predictions = ("logits", "probs", "class")

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels, reduction="none")

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.loss(logits, labels), "acc": (logits.argmax(dim=1) == labels).float()}

    def epoch_sums(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        classes = logits.shape[1]
        pairs = (labels * classes + logits.argmax(dim=1))[labels >= 0]  # (an ignored label, -100: not counted)
        return {"confusion_matrix": torch.bincount(pairs, minlength=classes**2).view(classes, classes)}

    def epoch_metrics(self, epoch: dict[str, torch.Tensor]) -> dict[str, Any]:
        # Macro-F1 as scikit-learn's: over the classes true or predicted at least once, 2 TP / (2 TP + FP + FN).
        matrix = epoch["confusion_matrix"]
        hits, seen = 2 * matrix.diagonal().double(), (matrix.sum(0) + matrix.sum(1)).double()
        return {"macro_f1": (hits / seen)[seen > 0].mean().item(), "confusion_matrix": matrix}

    def predict(self, logits: torch.Tensor, kind: str) -> torch.Tensor:
        return predicted(logits, kind, dim=1)


IGNORE = -100  # a target position that is padding (pad_windows): no loss, not counted


class Gathered(NamedTuple):
    """What gather_with_grad returns: every rank's rows, in rank order."""

    rows: torch.Tensor  # (the step's micro-batch over all ranks, ...): this rank's rows carry their gradient
    real: torch.Tensor  # bool (rows,): False for the sampler's padding samples (weight 0), which must count nothing
    start: int  # this rank's first row in `rows`


_weights: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("sample_weights", default=None)


@contextlib.contextmanager
def sample_weights(weights: torch.Tensor) -> Iterator[None]:
    """The micro-batch's sample weights (0: padding), set by the step runner: what gather_with_grad marks real."""
    token = _weights.set(weights)
    try:
        yield
    finally:
        _weights.reset(token)


def gather_with_grad(tensor: torch.Tensor) -> Gathered:
    """Every rank's `tensor` (rows: its micro-batch's samples, any number per rank) in rank order, with the
    gradient each rank's loss gives every row (docs/tasks.md, "Over the batch"). A collective: every rank
    calls it at the same point of its loss. Without a process group, the tensor itself."""
    weights = _weights.get()
    real = torch.ones(len(tensor), dtype=torch.bool, device=tensor.device) if weights is None else weights > 0
    real = real.to(tensor.device)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return Gathered(tensor, real, 0)
    sizes = torch.tensor([len(tensor)], device=tensor.device)
    every_size = [torch.zeros_like(sizes) for _ in range(dist.get_world_size())]
    dist.all_gather(every_size, sizes)
    counts = [int(size.item()) for size in every_size]
    rows = _GatherRows.apply(tensor, counts)
    everyone_real = _GatherRows.apply(real.float(), counts).bool()
    return Gathered(rows, everyone_real, sum(counts[: dist.get_rank()]))


class _GatherRows(torch.autograd.Function):
    """All-gather of rows of uneven counts (padded to the largest for the collective); backward, the
    gathered rows' gradient summed over the ranks (one all-reduce), this rank's rows of it."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, counts: list[int]) -> torch.Tensor:
        ctx.counts, ctx.rank = counts, dist.get_rank()
        padded = tensor.new_zeros((max(counts), *tensor.shape[1:]))
        padded[: len(tensor)] = tensor
        parts = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(parts, padded.contiguous())
        return torch.cat([part[:count] for part, count in zip(parts, counts, strict=True)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad)  # every rank's loss's gradient with respect to every row, summed
        start = sum(ctx.counts[: ctx.rank])
        return grad[start : start + ctx.counts[ctx.rank]], None


class InfoNCE:
    """A contrastive loss with in-batch negatives over the global micro-batch (an example to adapt;
    docs/tasks.md): the model returns (queries, keys); each query's positive is its own key, every other
    key of every rank a negative. Evaluation does not gather: each batch's own negatives."""

    def __init__(self, temperature: float = 0.1) -> None:
        self.temperature = temperature

    def similarities(self, outputs: tuple[torch.Tensor, torch.Tensor], gather: bool) -> tuple[torch.Tensor, ...]:
        queries, keys = (F.normalize(embedding.float(), dim=-1) for embedding in outputs)
        candidates = gather_with_grad(keys) if gather else Gathered(keys, torch.ones_like(keys[:, 0]).bool(), 0)
        logits = (queries @ candidates.rows.T / self.temperature).masked_fill(~candidates.real, -math.inf)
        positives = torch.arange(len(queries), device=logits.device) + candidates.start
        mine = candidates.real[candidates.start : candidates.start + len(queries)]
        return logits, positives, mine

    def loss(self, outputs: tuple[torch.Tensor, torch.Tensor], targets: Any) -> tuple[torch.Tensor, torch.Tensor]:
        logits, positives, mine = self.similarities(outputs, gather=True)
        per_query = F.cross_entropy(logits, positives, reduction="none")
        return per_query.where(mine, 0.0).sum(), mine.sum()  # a padding query (its key masked) counts nothing

    def metrics(self, outputs: tuple[torch.Tensor, torch.Tensor], targets: Any) -> dict[str, torch.Tensor]:
        logits, positives, _ = self.similarities(outputs, gather=False)
        return {"loss": F.cross_entropy(logits, positives, reduction="none"),
                "acc": (logits.argmax(dim=1) == positives).float()}  # fmt: skip


class ClassificationWithAux(Classification):
    """Classification of a model that returns (logits, aux), aux a scalar term of its own (models.MixtureOfExperts)
    added to the loss with `aux_weight`, as a pair (docs/tasks.md, "Auxiliary terms"); val_aux its mean."""

    def __init__(self, aux_weight: float = 0.01) -> None:
        self.aux_weight = aux_weight

    def loss(self, outputs: tuple[torch.Tensor, torch.Tensor], labels: torch.Tensor) -> tuple[torch.Tensor, int]:  # type: ignore[override]
        logits, aux = outputs
        total = F.cross_entropy(logits.float(), labels, reduction="sum")
        return total + self.aux_weight * aux.float() * len(labels), len(labels)

    def metrics(self, outputs: tuple[torch.Tensor, torch.Tensor], labels: torch.Tensor) -> dict[str, Any]:  # type: ignore[override]
        logits, aux = outputs
        return {"loss": super().loss(logits, labels), "acc": (logits.argmax(dim=1) == labels).float(),
                "aux": (aux.double() * len(labels), len(labels))}  # fmt: skip

    def epoch_sums(self, outputs: tuple[torch.Tensor, torch.Tensor], labels: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return super().epoch_sums(outputs[0], labels)

    def predict(self, outputs: tuple[torch.Tensor, torch.Tensor], kind: str) -> torch.Tensor:  # type: ignore[override]
        return super().predict(outputs[0], kind)


def predicted(logits: torch.Tensor, kind: str, dim: int) -> torch.Tensor:
    """The logits as they are, their softmax over `dim` (in float32), or their argmax (int64)."""
    if kind == "logits":
        return logits
    if kind == "probs":
        return F.softmax(logits.float(), dim=dim)
    return logits.argmax(dim=dim)


# What a checkpoint's config may build (engine/checkpoint/trust.py): add yours here, or a module's BUILDABLE.
BUILDABLE = (Classification, InfoNCE, ClassificationWithAux, *buildable_beside(__name__, __path__))


def __getattr__(name: str) -> Any:
    """`tasks.<Name>`: what a module beside this one defines, by the name configs and checkpoints give."""
    return defined_beside(__name__, __path__, name)

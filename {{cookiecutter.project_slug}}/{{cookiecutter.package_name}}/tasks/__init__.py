"""Tasks: what a batch's loss is and what evaluation reports.

A task is any object with two methods, chosen by `task._target_`:

- `loss(outputs, targets)`: either one loss per sample, shape (batch,), which training weights
  (padding of the last, short batch has weight 0) and averages over exactly the step's real samples;
  or a pair `(total, count)`: the loss summed over the micro-batch's items (tokens, pairs, anything)
  and how many items it covers. The step's gradient is then that of the sum of every micro-batch's
  total over the sum of every count, over the step's whole global batch (every micro-batch of every
  rank), at any world size and trainer.grad_accum_steps (engine/trainer.py, StepRunner).
- `metrics(outputs, targets)`: a dict by name of per-sample values, each of shape (batch,), or of
  `(total, count)` pairs. Evaluation sums the values (or the totals, and the counts) in float64 over
  the whole set, across ranks, and divides by the number of samples (or the sum of the counts): the
  figures equal a one-process evaluation's at any world size. They are reported as `val_<name>`; the
  first one (by convention `loss`) is the validation loss.
- optionally `summarise(means)`: the figures reported, from those means (a ratio of two sums over the
  whole set: bits per byte, from the loss and the bytes per token); without it, the means are the figures.
- optionally, metrics of the whole set at once (AUROC, macro-F1, a confusion matrix): `epoch_outputs` (per
  sample, gathered in sample order) and/or `epoch_sums` (counts, summed exactly) of (outputs, targets), which
  `epoch_metrics(epoch)` turns into figures and tables (engine/evaluate.py; docs/tasks.md, "Over the whole set").

Outputs are what the model returns; targets what the data set's items carry after the input.

A loss over the whole batch at once (contrastive, with the other samples as negatives) gathers what
it compares across the ranks with `gather_with_grad` (InfoNCE below); a term the model returns beside
its outputs (a mixture of experts' balance term) is added to the total (ClassificationWithAux below).
docs/tasks.md says what "exact" means for each form.

Optionally, what predict.py saves of the outputs: `predict(outputs, kind)` returns a tensor whose first
dimension is the batch's, and `predictions` names the kinds it takes (`predict_as=<kind>`), the first
one the default. A task without them has the model's outputs saved as they are (a tensor).
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
    """What `task._target_` builds: the two methods above. Any object that has them is a task."""

    def loss(self, outputs: Any, targets: Any) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """One loss per sample, shape (batch,); or (total, count): the items' summed loss and their number."""
        ...

    def metrics(self, outputs: Any, targets: Any) -> dict[str, Any]:
        """Per-sample values by name, each of shape (batch,), or (total, count) pairs; the first is the
        validation loss."""
        ...


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


# --- a loss over the whole batch: the other samples of every rank as negatives


class Gathered(NamedTuple):
    """What gather_with_grad returns: every rank's rows, in rank order."""

    rows: torch.Tensor  # (the step's micro-batch over all ranks, ...): this rank's rows carry their gradient
    real: torch.Tensor  # bool (rows,): False for the sampler's padding samples (weight 0), which must count nothing
    start: int  # this rank's first row in `rows`


_weights: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("sample_weights", default=None)


@contextlib.contextmanager
def sample_weights(weights: torch.Tensor) -> Iterator[None]:
    """The micro-batch's sample weights (0: padding), as the step runner sets them for its loss: what
    gather_with_grad marks as real."""
    token = _weights.set(weights)
    try:
        yield
    finally:
        _weights.reset(token)


def gather_with_grad(tensor: torch.Tensor) -> Gathered:
    """Every rank's `tensor` (its first dimension the micro-batch's samples; the ranks may hold
    different numbers of them), concatenated in rank order, differentiable: the gradient that reaches
    each rank's rows is the sum of what every rank's loss gives them. With it, a loss compares each
    sample with the whole global micro-batch (in-batch negatives over all ranks), and the step's
    gradient is that of one process computing the same loss over the same global micro-batch.

    Every rank must call it at the same point of its loss (it is a collective: two all-gathers forward,
    the first of the row counts, read back to the host; one all-reduce of the rows' gradient backward).
    Without a process group (one process) it returns the tensor itself. `real` marks the sampler's
    padding samples (False), to be left out of the loss."""
    weights = _weights.get()
    real = torch.ones(len(tensor), dtype=torch.bool, device=tensor.device)
    if weights is not None:
        real = weights.to(tensor.device) > 0
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
        rank, longest = dist.get_rank(), max(counts)
        ctx.counts, ctx.rank = counts, rank
        padded = tensor.new_zeros((longest, *tensor.shape[1:]))
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
    """A contrastive loss with in-batch negatives over the global micro-batch (an example to adapt).

    The model returns two embeddings per sample, (queries, keys), each (batch, dim): two views of one
    item, an image and its caption. Each query's positive is its own key; every other key of every
    rank's micro-batch is a negative (gather_with_grad). The loss is the cross-entropy of the cosine
    similarities over `temperature`, summed over the real queries: a pair (total, count), so the step's
    loss is the mean over every query of the global batch. Targets are not used. Metrics: the same
    loss, with the evaluation batch's own negatives on each rank (evaluation does not gather), and
    the accuracy of picking the positive among them.
    """

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


# --- an auxiliary term the model returns


class ClassificationWithAux(Classification):
    """Classification of a model that returns (logits, aux): aux a scalar term of its own (a mixture of
    experts' load balance, a regulariser; models.MixtureOfExperts), added to the loss with `aux_weight`.

    The loss is a pair: the cross-entropy summed over the micro-batch's samples plus aux_weight * aux
    times their number, over that number: the step's loss is the mean cross-entropy over the global
    batch plus aux_weight times the mean of each micro-batch's aux weighted by its samples. Metrics,
    predictions: Classification's, of the logits (val_aux: the term's mean over the set).
    """

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


# What a checkpoint's config may build (engine/checkpoint/trust.py): a task of yours here, named by no config
# file, is added to it (or a module of yours beside this one, with a BUILDABLE of its own); anything of the
# package not listed is refused. The tasks of the modules beside this one are found there, by what is present.
BUILDABLE = (Classification, InfoNCE, ClassificationWithAux, *buildable_beside(__name__, __path__))


def __getattr__(name: str) -> Any:
    """`tasks.<Name>`: the name configs, saved checkpoints and imports give what a module beside this one
    defines."""
    return defined_beside(__name__, __path__, name)

"""The step's gradient for each form of loss (issue #35): per sample, token-weighted (total, count) and
contrastive over the global batch (gather_with_grad). One optimizer step of the project's StepRunner on
real gloo ranks, at world sizes 1, 2 and 3 and grad_accum_steps 1 and 2, on sequences of uneven lengths
split unevenly (a rank left with nothing gets the sampler's padding sample of weight 0), equals a plain
single-process PyTorch computation on the same global batch."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.tensor import DTensor

from {{cookiecutter.package_name}}.config import TrainerConfig, to_train_config
from {{cookiecutter.package_name}}.config.values import train_defaults
from {{cookiecutter.package_name}}.datasets.collate import pad_sequences, pad_windows
from {{cookiecutter.package_name}}.engine.ema import EMA
from {{cookiecutter.package_name}}.engine.strategies import Strategy, strategy_class
from {{cookiecutter.package_name}}.engine.trainer import StepRunner
from {{cookiecutter.package_name}}.tasks import IGNORE, Classification, InfoNCE

from ..helpers import CPU, STRATEGIES, BagOfTokens, compose_config, on_ranks
from .test_evaluate import PerPosition, TokenLoss

LENGTHS = [3, 9, 1, 6, 4]  # the global batch: 5 sequences of uneven lengths


class TwoTowers(nn.Module):
    """Two embeddings of a sequence (queries, keys): the mean embedding of its real tokens in each tower."""

    def __init__(self) -> None:
        super().__init__()
        self.queries, self.keys = nn.EmbeddingBag(64, 8, mode="sum"), nn.EmbeddingBag(64, 8, mode="sum")

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        real = (torch.arange(tokens.shape[1]) < lengths[:, None]).float() / lengths[:, None]
        return self.queries(tokens, per_sample_weights=real), self.keys(tokens, per_sample_weights=real)


def items(kind: str) -> list:
    generator = torch.Generator().manual_seed(7)
    sequences = [torch.randint(0, 16, (length + 1,), generator=generator) for length in LENGTHS]
    if kind == "tokens":  # windows of tokens: the next token at each position
        return [(sequence[:-1], sequence[1:]) for sequence in sequences]
    return [(sequence[:-1], number % 3) for number, sequence in enumerate(sequences)]


def case(kind: str) -> tuple[nn.Module, object, object]:
    """(the model with its initial weights, the task, the collate) of each form."""
    torch.manual_seed(0)
    if kind == "sample":
        return BagOfTokens(), Classification(), pad_sequences
    if kind == "tokens":
        return PerPosition(), TokenLoss(), pad_windows  # a per-position model, a token-weighted loss
    return TwoTowers(), InfoNCE(temperature=0.5), pad_sequences


def split(count: int, parts: int) -> list[range]:
    """`count` consecutive positions in `parts` runs, as even as possible, the longer first (as the sampler splits)."""
    sizes = [count // parts + (part < count % parts) for part in range(parts)]
    starts = [sum(sizes[:part]) for part in range(parts)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def micro_batches(world_size: int, rank: int, accum: int) -> list[tuple[list[int], list[float]]]:
    """This rank's micro-batches of the global batch: (the samples' positions, their weights); the
    step's micro-batch `k` over all ranks is the k-th run of the batch (rounds), split among the ranks."""
    batches = []
    for round_ in split(len(LENGTHS), accum):
        mine = split(len(round_), world_size)[rank]
        positions = [round_[i] for i in mine]
        batches.append((positions, [1.0] * len(positions)) if positions else ([0], [0.0]))  # padding
    return batches


def one_step(  # noqa: PLR0913
    env,  # noqa: ANN001
    kind: str,
    accum: int,
    strategy: str,
    clip: float = 0.0,
    decay: float = 0.0,
    reductions: list | None = None,
) -> list[torch.Tensor]:
    """The weights' change in one SGD step (lr 1: minus the gradient) through the project's StepRunner;
    with `decay`, the change of the trainer's EMA of the weights after it too (appended). `reductions`
    gets a 1 for each gradient reduction the step made (DDP's bucket all-reduces, a sharding strategy's
    reduce-scatters)."""
    model, task, collate = case(kind)
    before = [p.detach().clone() for p in model.parameters()]
    config = TrainerConfig(
        epochs=1, log_every_n_steps=1, record_samples=False, precision="fp32", channels_last=False,
        compile=False, grad_accum_steps=accum, clip_grad_norm=clip,
    )  # fmt: skip
    spread = strategy_class(strategy)(sections(config), env)
    model = spread.prepare(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    trained = spread.wrap(model, optimizer)
    counting: contextlib.AbstractContextManager = contextlib.nullcontext()
    if reductions is not None:
        counting = counted(trained, strategy, reductions)
    runner = StepRunner(trained, optimizer, config, env.device, env.world_size, task, spread)  # type: ignore[arg-type]
    ema = EMA(model, decay, start_step=0) if decay else None
    data = items(kind)
    batches = micro_batches(env.world_size, env.rank, accum)
    with counting:
        for number, (positions, weights) in enumerate(batches, 1):
            inputs, targets = collate([data[i] for i in positions])
            runner.micro_step(inputs, targets, torch.tensor(weights), len(LENGTHS), sync=number == len(batches))
    runner.optimizer_step()
    after = [whole(p.detach()) for p in model.parameters()]
    if ema is not None:
        ema.update(1)
        after += [whole(average) for average in ema.average]
        before += before
    return [b - a for b, a in zip(before, after, strict=True)]


def sections(trainer: TrainerConfig) -> SimpleNamespace:
    """What a strategy reads of a TrainConfig: `trainer`, and each other section (ddp's, any other strategy's
    own) as configs/train.yaml sets it; no Hydra compose in each rank's process (a second there)."""
    yaml = {name: SimpleNamespace(**values) for name, values in train_defaults().items() if isinstance(values, dict)}
    return SimpleNamespace(**{**yaml, "trainer": trainer})


@contextlib.contextmanager
def counted(trained: nn.Module, strategy: str, reductions: list) -> Iterator[None]:
    """Count the gradient reductions: a comm hook around DDP's all-reduce of each bucket; a sharding
    strategy's reduce-scatter (torch.distributed's, looked up at each call)."""
    if strategy == "ddp":

        def counting_allreduce(state, bucket):  # noqa: ANN001, ANN202
            reductions.append(1)
            return default_hooks.allreduce_hook(state, bucket)

        trained.register_comm_hook(None, counting_allreduce)  # type: ignore[operator]
        yield
        return
    original = torch.distributed.reduce_scatter_single

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        reductions.append(1)
        return original(*args, **kwargs)

    torch.distributed.reduce_scatter_single = counting  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.distributed.reduce_scatter_single = original  # type: ignore[assignment]


def whole(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def plain_gradient(kind: str, accum: int) -> list[torch.Tensor]:
    """The gradient one process computes on the whole global batch, in plain PyTorch."""
    model, _, collate = case(kind)
    data = items(kind)
    if kind == "sample":  # the mean of the samples' cross-entropies
        (padded, lengths), labels = collate(data)
        loss = F.cross_entropy(model(padded, lengths), labels)
    elif kind == "tokens":  # the mean over every real token of the batch
        inputs, targets = collate(data)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten(), ignore_index=-100)
    else:  # InfoNCE over each step's micro-batch of all ranks (a round), summed, over all the queries
        total = torch.zeros(())
        for round_ in split(len(LENGTHS), accum):
            (padded, lengths), _ = collate([data[i] for i in round_])
            queries, keys = (F.normalize(e, dim=-1) for e in model(padded, lengths))
            total = total + F.cross_entropy(queries @ keys.T / 0.5, torch.arange(len(round_)), reduction="sum")
        loss = total / len(LENGTHS)
    loss.backward()
    return [p.grad for p in model.parameters()]


def every_form(env) -> dict:  # noqa: ANN001
    """Each form's step at grad_accum_steps 1 and 2 under ddp (at one rank, no wrapper), and under each
    other strategy the project has where it differs: the (total, count) and contrastive forms with
    accumulation on several ranks (a sharding strategy's gradients are DTensors: each rank scales its shard)."""
    forms = {}
    for accum in (1, 2):
        for kind in ("sample", "tokens", "contrastive"):
            for strategy in STRATEGIES:
                if strategy == "ddp" or (env.world_size > 1 and accum > 1 and kind != "sample"):
                    forms[kind, strategy, accum] = one_step(env, kind, accum, strategy)
    return forms


@pytest.mark.parametrize(
    "world_size", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)]
)
def test_one_step_of_each_form_of_loss_is_the_plain_gradient_of_the_global_batch(world_size: int) -> None:
    if world_size == 3:  # the case has a padding sample: the second round of 2 samples for 3 ranks
        assert micro_batches(3, 2, 2)[1] == ([0], [0.0])
    ranks = on_ranks(world_size, every_form, timeout=180)
    for (kind, strategy, accum), moved in ranks[0].items():
        expected, where = plain_gradient(kind, accum), f"{kind}, {strategy}, grad_accum_steps={accum}"
        for got, want in zip(moved, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=lambda m, where=where: f"{where}: {m}")
        for other in ranks[1:]:  # every rank took the same step
            assert all(torch.equal(a, b) for a, b in zip(moved, other[kind, strategy, accum], strict=True))


def test_the_token_weighted_loss_weighs_each_window_by_its_tokens_not_each_window_alike() -> None:
    """The case the per-sample mean got wrong: a 1-token window weighs as much as a 9-token one there."""
    logits = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(3))
    inputs, targets = pad_windows([(torch.arange(9), torch.arange(1, 10) % 16), (torch.tensor([4]), torch.tensor([5]))])
    assert inputs.shape == targets.shape == (2, 9) and (targets[1, 1:] == -100).all() and (inputs[1, 1:] == 0).all()
    total, count = TokenLoss().loss(logits, targets)
    assert count == 10
    per_token = torch.cat([F.cross_entropy(logits[0], targets[0], reduction="none"),
                           F.cross_entropy(logits[1, :1], targets[1, :1], reduction="none")])  # fmt: skip
    torch.testing.assert_close(total / count, per_token.mean())
    assert not math.isclose((total / count).item(), (per_token[:9].mean() + per_token[9]).item() / 2, rel_tol=1e-3)


def test_a_step_that_counted_no_items_takes_a_zero_finite_gradient_and_is_known_empty_on_the_device() -> None:
    """Every target masked: the global count is 0. The gradients stay 0 (clipped, still finite), the weights
    do not move under plain SGD, and the step's count stays on the device for the log line's empty_steps."""
    model, task, collate = case("tokens")
    before = [p.detach().clone() for p in model.parameters()]
    config = TrainerConfig(
        epochs=1, log_every_n_steps=1, record_samples=False, precision="fp32", channels_last=False,
        compile=False, grad_accum_steps=1, clip_grad_norm=1.0,
    )  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    plain = Strategy(to_train_config(compose_config()), CPU)  # the base strategy: no wrapper, no reduction
    runner = StepRunner(model, optimizer, config, CPU.device, 1, task, plain)  # type: ignore[arg-type]
    inputs, targets = collate(items("tokens")[:3])
    total = runner.micro_step(inputs, torch.full_like(targets, IGNORE), torch.ones(3), 3, sync=True)
    norm = runner.optimizer_step()
    assert total == 0 and norm == 0 and runner.step_count == 0 and runner.step_count.device == CPU.device
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def reductions_per_step(env) -> dict:  # noqa: ANN001
    """How many gradient reductions one optimizer step makes, of one micro-batch and of two, under each
    strategy: ddp on the per-sample form, the others on the (total, count) one."""
    counts: dict = {}
    for strategy in STRATEGIES:
        kind = "sample" if strategy == "ddp" else "tokens"
        for accum in (1, 2):
            counts[strategy, accum] = []
            one_step(env, kind, accum, strategy, reductions=counts[strategy, accum])
    return {key: len(calls) for key, calls in counts.items()}


def test_accumulated_micro_batches_reduce_the_gradients_once_per_optimizer_step() -> None:
    """Each strategy's gradient_sync (DDP's `no_sync`) before the last micro-batch: the gradients of two
    micro-batches cross the network once, as one micro-batch's do. Their values: above."""
    for counts in on_ranks(2, reductions_per_step):
        for strategy in STRATEGIES:
            assert counts[strategy, 2] == counts[strategy, 1] >= 1, (strategy, counts)

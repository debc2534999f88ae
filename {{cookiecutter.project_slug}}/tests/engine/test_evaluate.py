"""evaluate.py in this process: exact means over the whole set, from shards that add up at any world size;
on up to 3 ranks, the same figures in lock step (a filler forward on a rank with fewer batches) and under
each strategy, as the trainer validates. (A sharding strategy's own validation: tests/engine/strategies/.)"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from {{cookiecutter.package_name}}.config import DataConfig, to_train_config
from {{cookiecutter.package_name}}.datasets.collate import model_forward, pad_windows
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer, prepare_model
from {{cookiecutter.package_name}}.engine.assembly.components import build_model
from {{cookiecutter.package_name}}.engine.data.loader import build_data
from {{cookiecutter.package_name}}.engine.evaluate import EvalResult, evaluate, summed
from {{cookiecutter.package_name}}.engine.strategies import build_strategy
from {{cookiecutter.package_name}}.tasks import IGNORE, Classification

from ..helpers import SMALL, STRATEGIES, BagOfTokens, compose_config, cpu_env, on_ranks, sequence_data

CPU = torch.device("cpu")


def val_loaders(world_size: int, val_size: int = 23) -> list[DataLoader]:
    """Each rank's evaluation loader (batches of 4: the last one short) over a synthetic set."""
    overrides = ["data=synthetic", "data.train_size=8", f"data.val_size={val_size}", "data.batch_size=4",
                 "data.num_workers=0"]  # fmt: skip
    config = to_train_config(compose_config(overrides))
    return [build_data(config.data, cpu_env(rank, world_size), seed=0).val_loader for rank in range(world_size)]


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))


def test_the_figures_are_means_over_exactly_every_sample_of_the_set() -> None:
    (loader,) = val_loaders(1)
    model = small_model()
    images, labels = (torch.cat(parts) for parts in list(zip(*loader, strict=False))[:2])
    with torch.no_grad():
        logits = model(images)
    expected_loss = F.cross_entropy(logits, labels, reduction="none").double().mean().item()
    correct = int((logits.argmax(dim=1) == labels).sum())
    result = evaluate(model, loader, Classification(), CPU)
    assert result.samples == 23, "every sample once: no padding, the short last batch counted"
    assert list(result.metrics) == ["loss", "acc", "macro_f1"], "the per-sample figures first, then the epoch's"
    assert result.metrics["loss"] == pytest.approx(expected_loss, rel=1e-6)
    assert result.metrics["acc"] == correct / 23
    assert model.training, "the model is put back in the mode it was in"


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_the_shards_of_any_world_size_add_up_to_the_one_process_figures(world_size: int) -> None:
    """What the all-reduce of the sums does across ranks, done here by hand over each rank's shard."""
    model = small_model()
    whole = evaluate(model, val_loaders(1)[0], Classification(), CPU)
    shards = [evaluate(model, loader, Classification(), CPU) for loader in val_loaders(world_size)]
    assert sum(shard.samples for shard in shards) == whole.samples == 23
    for name in ("loss", "acc"):  # (macro_f1 is no mean over the samples)
        value = whole.metrics[name]
        total = sum(shard.metrics[name] * shard.samples for shard in shards)
        # rel 1e-6, not 0: a sample's float32 loss may differ in its last bits in a batch of another size.
        assert total / whole.samples == pytest.approx(value, rel=1e-6), name


def evaluate_sequences(env) -> EvalResult:  # noqa: ANN001
    """Exact evaluation of items that do not stack (data.collate), in lock step: with 5 samples in
    batches of 2 on 2 ranks, rank 1 runs a filler forward of one sample, batched by the collate too."""
    data = build_data(sequence_data(batch_size=2), env, seed=0)
    torch.manual_seed(0)
    return evaluate(BagOfTokens(), data.val_loader, Classification(), env.device, lockstep=True)


def test_items_batched_by_a_collate_give_the_same_figures_at_one_and_two_ranks() -> None:
    one = evaluate_sequences(cpu_env(0, 1))
    two = on_ranks(2, evaluate_sequences)
    assert one.samples == two[0].samples == two[1].samples == 5
    assert two[0] == two[1]
    assert two[0].metrics == pytest.approx(one.metrics, rel=1e-6) and one.metrics["loss"] > 0


def test_a_rank_without_samples_still_reports_the_metric_names() -> None:
    """More ranks than samples: an empty shard must still join the all-reduce with the same metrics."""
    loaders = val_loaders(3, val_size=2)
    empty = next(loader for loader in loaders if len(loader.dataset) == 0)
    result = evaluate(small_model(), empty, Classification(), CPU)
    assert list(result.metrics) == ["loss", "acc", "macro_f1"] and result.samples == 0
    assert all(math.isnan(value) for value in result.metrics.values()), "alone, it counted nothing: not a 0"


def test_the_result_reads_as_metrics_jsonl_and_the_console_take_it() -> None:
    result = EvalResult({"loss": 0.5, "acc": 0.25}, 999)
    assert result.loss == 0.5
    assert result.record() == {"val_loss": 0.5, "val_acc": 0.25, "val_samples": 999}
    assert result.line() == "val_loss=0.500000 val_acc=0.250000 val_samples=999"


class WeightedLoss(Classification):
    """A figure that is a ratio of two sums over the whole set (as bits per byte are, from tokens' bits and bytes):
    each sample's loss weighted by its label + 1, over the sum of the weights."""

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        weights = labels.double() + 1
        return {"weighted": self.loss(logits, labels).double() * weights, "weights": weights}

    def summarise(self, means: dict[str, float]) -> dict[str, float]:
        return {"loss": means["weighted"] / means["weights"]}


def evaluate_weighted(env) -> EvalResult:  # noqa: ANN001
    data = build_data(sequence_data(batch_size=2), env, seed=0)
    torch.manual_seed(0)
    return evaluate(BagOfTokens(), data.val_loader, WeightedLoss(), env.device, lockstep=True)


def test_a_tasks_summarise_turns_the_sums_over_the_whole_set_into_its_figures_at_any_world_size() -> None:
    one = evaluate_weighted(cpu_env(0, 1))
    loader = build_data(sequence_data(batch_size=5), cpu_env(0, 1), seed=0).val_loader
    torch.manual_seed(0)
    model = BagOfTokens().eval()
    with torch.no_grad():
        batches = [WeightedLoss().metrics(model_forward(model, x), y) for x, y, *_ in loader]
    weighted, weights = (torch.cat([batch[name] for batch in batches]) for name in ("weighted", "weights"))
    assert one.metrics["loss"] == pytest.approx((weighted.sum() / weights.sum()).item())
    two = on_ranks(2, evaluate_weighted)
    assert two[0] == two[1] and two[0].metrics == pytest.approx(one.metrics, rel=1e-9)


# --- (total, count) metrics: a token-weighted loss, the mean over every token of the set


class PerPosition(nn.Module):
    """A logit per position and class (a token classifier): what a token-weighted task scores."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(16, 8), nn.Linear(8, 16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)))


class TokenLoss:
    """A (total, count) task: the cross-entropy summed over the real (not IGNORE) positions, and their number."""

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        total = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum", ignore_index=IGNORE)
        return total, (targets != IGNORE).sum()

    def metrics(self, logits: torch.Tensor, targets: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        # in float64: a batch's total must not depend on which windows share the batch (the world size)
        per_position = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none", ignore_index=IGNORE)
        return {"loss": (per_position.double().sum(), (targets != IGNORE).sum())}


def windows(train_size: int = 4, val_size: int = 7) -> tuple[list, list]:
    """(train, val) of windows of lengths 1 to 9 (window i: (i * 5) % 9 + 1 tokens), next-token targets."""

    def items(count: int, first: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        sequences = [torch.arange(first + i, first + i + (i * 5) % 9 + 2) % 16 for i in range(count)]
        return [(sequence[:-1], sequence[1:]) for sequence in sequences]

    return items(train_size, 0), items(val_size, 30)


def window_data(env, dataset: str = f"{__name__}.windows"):  # noqa: ANN001, ANN201
    """The windows batched by 2 through data.collate=pad_windows (padded at the end, targets IGNORE)."""
    node = {"batch_size": 2, "dataset": {"_target_": dataset},
            "collate": {"_target_": f"{pad_windows.__module__}.pad_windows"}}  # fmt: skip
    return build_data(DataConfig.from_node(node), env, seed=0)


def evaluate_windows(env) -> EvalResult:  # noqa: ANN001
    data = window_data(env)
    torch.manual_seed(0)
    return evaluate(PerPosition(), data.val_loader, TokenLoss(), env.device, lockstep=True)


def test_a_token_weighted_metric_is_the_mean_over_every_token_of_the_set_at_any_world_size() -> None:
    """(A task of the package's own that weighs by tokens, the same way: its own tests.)"""
    torch.manual_seed(0)
    model = PerPosition().eval()
    with torch.no_grad():  # one process, plain PyTorch: every window's token losses, one list
        losses = torch.cat([F.cross_entropy(model(x), y, reduction="none") for x, y in windows()[1]])
    one = evaluate_windows(cpu_env(0, 1))
    assert one.samples == 7 and one.metrics["loss"] == pytest.approx(losses.mean().item(), rel=1e-6)
    for world_size in (2, 3):  # shards of 4 and 3, or 3, 2 and 2 windows: a filler forward on the shorter ones
        ranks = on_ranks(world_size, evaluate_windows)
        assert all(rank == ranks[0] for rank in ranks) and ranks[0].samples == 7
        assert ranks[0].metrics == pytest.approx(one.metrics, rel=1e-6)


def test_counts_past_float32s_integers_stay_exact() -> None:
    """A token-weighted set counts tokens in the tens of millions: past 2**24 a float32 count would round,
    and every mean over the set with it."""
    many = 2**24 + 1
    assert summed(torch.ones(3), many).tolist() == [3.0, float(many)]
    assert summed((torch.tensor(3.0), many), 0).tolist() == [3.0, float(many)]
    assert summed((torch.tensor(3.0), torch.tensor(many)), 0).tolist() == [3.0, float(many)]


def masked_windows() -> tuple[list, list]:
    """windows() with every target masked (IGNORE, as pad_windows pads): a (total, count) pair counts nothing."""
    return tuple([(inputs, torch.full_like(targets, IGNORE)) for inputs, targets in part] for part in windows())


def test_a_validation_that_counted_no_items_is_nan_and_says_why() -> None:
    """Before: total / max(count, 1), val_loss=0.000000, the best a run could reach."""
    data = window_data(cpu_env(0, 1), f"{__name__}.masked_windows")
    torch.manual_seed(0)
    result = evaluate(PerPosition(), data.val_loader, TokenLoss(), CPU)
    assert result.samples == 7 and list(result.metrics) == ["loss"] and math.isnan(result.metrics["loss"])
    assert result.line() == "val_loss=nan val_samples=7"
    assert result.uncounted() == (
        "val_loss is NaN: the validation counted no items (every target masked?); such a validation "
        "is never ranked best nor counted as an improvement"
    )
    assert EvalResult({"loss": 0.5}, 3).uncounted() == ""


# --- epoch-level metrics: the whole set's outputs, gathered in sample order, and exact counts


class Scored(Classification):
    """Classification's figures (its macro-F1 from the counted confusion matrix) and, from the gathered
    probabilities, the AUROC of class 0 against the others and the macro-F1 of their argmax; `gathered`: how
    many samples came; `order`, their labels as gathered. (In plain torch: scikit-learn takes seconds to
    import in each rank's process.)"""

    def epoch_outputs(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"probs": logits.double().softmax(dim=1), "labels": labels}

    def epoch_metrics(self, epoch: dict[str, torch.Tensor]) -> dict[str, object]:
        probs, labels = epoch["probs"], epoch["labels"]
        scores, positive = probs[:, 0], labels == 0
        above = scores[positive][:, None] - scores[~positive][None, :]  # Mann-Whitney: ties count a half
        predicted = probs.argmax(dim=1)
        f1 = [2 * ((predicted == c) & (labels == c)).sum().double() / ((predicted == c).sum() + (labels == c).sum())
              for c in range(probs.shape[1]) if (predicted == c).any() or (labels == c).any()]  # fmt: skip
        return {**super().epoch_metrics(epoch), "gathered": float(len(labels)), "order": labels,
                "auroc": ((above > 0).double() + 0.5 * (above == 0).double()).mean().item(),
                "f1": torch.stack(f1).double().mean().item()}  # fmt: skip


# 3 classes: the untrained model's predictions vary (of 10 it predicts one class only)
SCORED = [*SMALL, "data.image_size=32", "data.num_classes=3", "data.train_size=16", "data.val_size=25",
          "data.batch_size=4"]  # fmt: skip


def scored_validation(env, strategy: str) -> EvalResult:  # noqa: ANN001
    """The validation as the trainer runs it under `strategy` (its model as the strategy holds it; in lock step
    where its forwards are collectives). 25 samples in batches of 4: shards of 12 and 13 (3 and 4 batches), or
    8, 8 and 9 (2, 2 and 3): a lock-step strategy runs filler forwards on the shorter ones, whose outputs must
    not be gathered. (No whole trainer: its optimizer imports torch._dynamo, seconds in each rank's process.)"""
    config = to_train_config(compose_config([*SCORED, f"strategy={strategy}"]))
    torch.manual_seed(config.seed)
    strategy = build_strategy(config, env)
    model, data = prepare_model(config, env, strategy), build_data(config.data, env, config.seed)
    return evaluate(model, data.val_loader, Scored(), env.device, lockstep=strategy.lockstep_evaluation)


def whole_set_figures() -> dict[str, object]:
    """scikit-learn's figures over the whole validation set, from one process's plain forward of the same model."""
    from sklearn.metrics import confusion_matrix, f1_score, roc_auc_score

    config = to_train_config(compose_config([*SCORED, "data.batch_size=25"]))
    torch.manual_seed(config.seed)
    model = build_model(config.model).eval()
    ((images, labels, *_),) = list(build_data(config.data, cpu_env(0, 1), config.seed).val_loader)
    with torch.no_grad():
        probs = model(images).double().softmax(dim=1).numpy()
    labels = labels.numpy()
    f1 = f1_score(labels, probs.argmax(axis=1), average="macro")
    return {"auroc": roc_auc_score(labels == 0, probs[:, 0]), "f1": f1, "macro_f1": f1, "order": labels.tolist(),
            "matrix": confusion_matrix(labels, probs.argmax(axis=1), labels=range(3)).tolist()}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_epoch_metrics_over_the_gathered_set_equal_scikit_learns_at_world_sizes_1_2_and_3(strategy: str) -> None:
    expected = whole_set_figures()
    assert 0.1 < expected["auroc"] < 0.9 and expected["f1"] > 0.2, "figures that move when a sample is counted twice"
    results = [rank for size in (1, 2, 3) for rank in on_ranks(size, scored_validation, strategy)]
    for result in results:
        assert list(result.metrics)[:2] == ["loss", "acc"], "the per-sample figures first, as before"
        for name in ("auroc", "f1", "macro_f1"):
            assert abs(result.metrics[name] - expected[name]) < 1e-12, (name, result.metrics[name], expected[name])
        assert result.metrics["gathered"] == result.samples == 25, "each sample once: no padding, no shard dropped"
        assert result.tables == {"confusion_matrix": expected["matrix"], "order": expected["order"]}, "in sample order"
        assert result == results[0]


def test_a_validation_writes_the_confusion_matrix_beside_metrics_jsonl_and_a_resume_cuts_it_back(tmp_path) -> None:
    overrides = [*SMALL, "data.image_size=32", "data.train_size=16", "data.val_size=25", "data.batch_size=4"]
    trainer = build_trainer(to_train_config(compose_config(overrides)), cpu_env(0, 1), tmp_path)
    for step in (1, 2):
        trainer.state.step = step
        record = trainer.validation().record()
    assert list(record)[:3] == ["val_loss", "val_acc", "val_macro_f1"]
    lines = [json.loads(line) for line in (tmp_path / "val_confusion_matrix.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    matrix = lines[0]["val_confusion_matrix"]
    assert len(matrix) == 10 and sum(map(sum, matrix)) == 25, "rows: true classes, columns: predicted, each sample once"
    trainer.metrics.drop_after(1)  # a resume from step 1 redoes step 2's validation
    assert (tmp_path / "val_confusion_matrix.jsonl").read_text().count("\n") == 1

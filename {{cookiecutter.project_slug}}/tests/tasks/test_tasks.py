"""tasks/: each task's loss (per sample, or a (total, count) pair) and its metrics, as torch's own
cross-entropy gives them; the tasks of the modules beside tasks/__init__.py: their own test files."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from {{cookiecutter.package_name}} import tasks
from {{cookiecutter.package_name}}.models import MixtureOfExperts
from {{cookiecutter.package_name}}.tasks import Classification, ClassificationWithAux, Task


def logits_and_labels(batch: int = 6, classes: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(batch, classes, generator=generator), torch.randint(0, classes, (batch,), generator=generator)


def test_the_classification_loss_is_one_cross_entropy_per_sample() -> None:
    logits, labels = logits_and_labels()
    loss = Classification().loss(logits, labels)
    assert loss.shape == (6,)
    for i in range(6):
        assert loss[i].item() == pytest.approx(F.cross_entropy(logits[i : i + 1], labels[i : i + 1]).item(), rel=1e-6)
    assert loss.mean().item() == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_loss_of_half_precision_logits_is_computed_in_float32(dtype: torch.dtype) -> None:
    logits, labels = logits_and_labels()
    half = logits.to(dtype)
    loss, expected = Classification().loss(half, labels), Classification().loss(logits.to(dtype).float(), labels)
    assert loss.dtype == torch.float32
    assert torch.equal(loss, expected)


def test_classification_metrics_are_the_loss_and_whether_each_sample_is_right() -> None:
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 1.0], [1.0, 4.0, 0.0]])
    labels = torch.tensor([0, 1, 0, 0])
    metrics = Classification().metrics(logits, labels)
    assert list(metrics) == ["loss", "acc"], "the first is the validation loss"
    assert metrics["acc"].tolist() == [1.0, 1.0, 0.0, 0.0] and metrics["acc"].dtype == torch.float32
    assert torch.equal(metrics["loss"], F.cross_entropy(logits, labels, reduction="none"))


def test_the_built_in_tasks_are_tasks_and_an_object_without_metrics_is_not() -> None:
    assert isinstance(Classification(), Task) and isinstance(ClassificationWithAux(), Task)

    class LossOnly:
        def loss(self, outputs, targets):  # noqa: ANN001, ANN202
            return outputs

    assert not isinstance(LossOnly(), Task)


def test_each_tasks_predictions_are_its_logits_their_softmax_or_their_argmax_over_the_classes() -> None:
    logits, _ = logits_and_labels()
    task = Classification()
    assert task.predictions == ("logits", "probs", "class")  # the first: predict.py's default
    assert task.predict(logits, "logits") is logits
    assert torch.equal(task.predict(logits, "probs"), torch.softmax(logits, dim=-1))
    assert torch.equal(task.predict(logits, "class"), logits.argmax(dim=-1))
    half = Classification().predict(logits.half(), "probs")
    assert half.dtype == torch.float32 and torch.allclose(half.sum(dim=1), torch.ones(6))


def test_a_models_auxiliary_term_is_added_to_the_loss_weighted_by_the_samples() -> None:
    torch.manual_seed(0)
    model = MixtureOfExperts(in_features=8, num_classes=3, experts=4)
    inputs, labels = torch.randn(5, 8), torch.tensor([0, 1, 2, 0, 1])
    logits, aux = model(inputs)
    assert logits.shape == (5, 3) and aux.shape == ()
    assert 1.0 <= aux.item() <= 4.0, "1 where every expert is used alike, 4 where one takes all"
    total, count = ClassificationWithAux(aux_weight=0.5).loss((logits, aux), labels)
    assert count == 5
    torch.testing.assert_close(total / count, F.cross_entropy(logits, labels) + 0.5 * aux)
    metrics = ClassificationWithAux().metrics((logits, aux), labels)
    assert list(metrics) == ["loss", "acc", "aux"]
    torch.testing.assert_close(metrics["loss"], F.cross_entropy(logits, labels, reduction="none"))
    assert metrics["aux"][1] == 5 and torch.isclose(metrics["aux"][0] / 5, aux.double())
    assert torch.equal(ClassificationWithAux().predict((logits, aux), "class"), logits.argmax(dim=1))


def test_a_task_of_a_module_beside_is_found_by_its_old_name_and_registered() -> None:
    # configs and saved checkpoints name a task of a module beside tasks.<Name>: wherever tasks/ keeps it,
    # that name finds it
    found = {task.__name__: task for task in tasks.BUILDABLE}
    assert {"Classification", "InfoNCE", "ClassificationWithAux"} <= found.keys()
    for name, task in found.items():
        assert getattr(tasks, name) is task
    with pytest.raises(AttributeError, match="module '{{cookiecutter.package_name}}.tasks' has no attribute 'Nope'"):
        tasks.Nope  # noqa: B018

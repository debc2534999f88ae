"""optim.py: the learning-rate schedule, a function of training progress in epochs (never of steps)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.optim import lr_at, set_lr

from ..helpers import compose_config


def optim(*overrides: str) -> dict[str, Any]:
    """optim as the trainer passes it to lr_at: the real group's keys, a peak of 0.4."""
    return to_train_config(compose_config(["optim=sgd", "optim.lr=0.4", *overrides])).optim


def test_warmup_rises_linearly_from_zero_to_the_peak() -> None:
    schedule = optim("optim.warmup_epochs=2", "optim.scheduler=cosine")
    rates = [lr_at(schedule, epoch, 10) for epoch in (0.0, 0.5, 1.0, 1.5, 2.0)]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])


def test_cosine_falls_from_the_peak_to_zero_at_the_last_epoch_and_stays_there() -> None:
    schedule = optim("optim.warmup_epochs=2", "optim.scheduler=cosine")
    assert lr_at(schedule, 6.0, 10) == pytest.approx(0.2), "half the peak halfway through the epochs after warm-up"
    assert lr_at(schedule, 10.0, 10) == pytest.approx(0.0, abs=1e-12)
    assert lr_at(schedule, 11.5, 10) == pytest.approx(0.0, abs=1e-12), "past the end (a longer resume): no rise"
    falling = [lr_at(schedule, 2.0 + 0.25 * i, 10) for i in range(33)]
    assert all(a > b for a, b in zip(falling, falling[1:], strict=False))


def test_constant_keeps_the_peak_after_the_warmup() -> None:
    schedule = optim("optim.warmup_epochs=1", "optim.scheduler=constant")
    assert lr_at(schedule, 0.5, 10) == pytest.approx(0.2)
    assert [lr_at(schedule, epoch, 10) for epoch in (1.0, 5.0, 10.0)] == [0.4, 0.4, 0.4]


def test_without_warmup_the_schedule_starts_at_the_peak() -> None:
    schedule = optim("optim.warmup_epochs=0", "optim.scheduler=cosine")
    assert lr_at(schedule, 0.0, 4) == pytest.approx(0.4)
    assert lr_at(schedule, 2.0, 4) == pytest.approx(0.2)
    assert lr_at({"lr": 0.1}, 0.0, 4) == 0.1, "a user's optim without the schedule keys: cosine, no warm-up"


def test_set_lr_sets_every_parameter_group() -> None:
    weight, bias = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([{"params": [weight], "weight_decay": 1e-4}, {"params": [bias]}], lr=1.0)
    set_lr(optimizer, 0.05)
    assert [group["lr"] for group in optimizer.param_groups] == [0.05, 0.05]

"""engine/schedule.py: the learning rate of each step, a warm-up then the scheduler group's `_target_`:
the project's (a factor of progress in epochs, or in steps with trainer.max_steps) or any stepped one
(torch.optim.lr_scheduler.*), whose resume continues exactly."""

from __future__ import annotations

import math

import pytest
import torch

from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.schedule import Cosine, RunLength, Schedule
from {{cookiecutter.package_name}}.errors import ConfigError

from ..helpers import compose_config


def optimizer(lr: float = 0.4) -> torch.optim.Optimizer:
    weight, bias = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.zeros(1))
    return torch.optim.SGD([{"params": [weight], "weight_decay": 1e-4}, {"params": [bias]}], lr=lr)


def scheduler_node(*overrides: str) -> dict:
    """The scheduler group's node as the trainer gets it (the real yaml files)."""
    return to_train_config(compose_config(list(overrides))).scheduler


def rates(schedule: Schedule, points: list[float]) -> list[float]:
    found = []
    for done in points:
        schedule.before_step(done)
        found.append(schedule.optimizer.param_groups[0]["lr"])
        assert len({group["lr"] for group in schedule.optimizer.param_groups}) == 1, "every group alike"
        schedule.optimizer.step()  # no gradients: nothing moves, as torch's schedulers expect it first
        schedule.after_step()
    return found


def test_cosine_warms_up_linearly_then_falls_to_zero_by_the_end_in_epochs() -> None:
    node = scheduler_node("scheduler=cosine", "scheduler.warmup_epochs=2")
    schedule = Schedule(node, optimizer(), RunLength.of(node, epochs=10, max_steps=0, steps_per_epoch=7))
    assert rates(schedule, [0.5, 1.0, 1.5]) == pytest.approx([0.1, 0.2, 0.3])
    assert rates(schedule, [2.0, 6.0, 10.0, 11.5]) == pytest.approx([0.4, 0.2, 0.0, 0.0], abs=1e-12)
    falling = rates(schedule, [2.0 + 0.25 * i for i in range(33)])
    assert all(a >= b for a, b in zip(falling, falling[1:], strict=False)), "never rises after the warm-up"


def test_the_project_schedules_equal_the_formula_they_replace_bit_for_bit() -> None:
    """Runs from before the scheduler group keep their learning rates exactly (and so their weights)."""
    node = scheduler_node("scheduler=cosine", "scheduler.warmup_epochs=0.5")
    schedule = Schedule(node, optimizer(0.1), RunLength.of(node, epochs=3, max_steps=0, steps_per_epoch=5))
    points = [step / 5 for step in range(1, 16)]
    old = [0.1 * p / 0.5 if p < 0.5 else 0.1 * 0.5 * (1.0 + math.cos(math.pi * min((p - 0.5) / 2.5, 1.0)))
           for p in points]  # fmt: skip
    assert rates(schedule, points) == old


def test_constant_holds_the_peak_after_its_warm_up() -> None:
    node = scheduler_node("scheduler=constant", "scheduler.warmup_epochs=1")
    schedule = Schedule(node, optimizer(), RunLength.of(node, epochs=10, max_steps=0, steps_per_epoch=4))
    assert rates(schedule, [0.5, 1.0, 5.0, 10.0]) == pytest.approx([0.2, 0.4, 0.4, 0.4])


def test_with_max_steps_the_schedule_counts_steps_and_warmup_steps_wins_over_epochs() -> None:
    node = scheduler_node("scheduler=cosine", "scheduler.warmup_steps=4", "scheduler.warmup_epochs=3")
    length = RunLength.of(node, epochs=99, max_steps=20, steps_per_epoch=5)
    assert length == RunLength(total=20, warmup=4, by_steps=True)
    assert rates(Schedule(node, optimizer(), length), [2, 4, 12, 20]) == pytest.approx([0.2, 0.4, 0.2, 0.0], abs=1e-12)
    in_epochs = RunLength.of(scheduler_node("scheduler.warmup_epochs=1.5"), epochs=4, max_steps=20, steps_per_epoch=6)
    assert in_epochs.warmup == 9, "warmup_epochs converted at this run's steps per epoch"
    assert RunLength.of(node, epochs=8, max_steps=0, steps_per_epoch=5).warmup == 0.8, "warmup_steps in epochs"


def step_lr(*extra: str) -> dict:
    return scheduler_node("scheduler._target_=torch.optim.lr_scheduler.StepLR", "+scheduler.step_size=2",
                          "+scheduler.gamma=0.5", *extra)  # fmt: skip


def test_a_torch_scheduler_takes_over_from_the_warm_up_stepped_once_per_optimizer_step() -> None:
    node = step_lr("scheduler.warmup_steps=2")
    schedule = Schedule(node, optimizer(), RunLength.of(node, epochs=1, max_steps=10, steps_per_epoch=10))
    assert rates(schedule, list(range(1, 9))) == pytest.approx([0.2, 0.4, 0.4, 0.2, 0.2, 0.1, 0.1, 0.05])


def test_a_resumed_torch_scheduler_continues_exactly(tmp_path) -> None:
    node = step_lr("scheduler.warmup_steps=1")
    length = RunLength.of(node, epochs=1, max_steps=12, steps_per_epoch=12)
    whole = Schedule(node, optimizer(), length)
    expected = rates(whole, list(range(1, 13)))
    first = Schedule(node, optimizer(), length)
    rates(first, list(range(1, 6)))
    path = tmp_path / "state.pt"
    torch.save({**first.state_dict(), "optimizer": first.optimizer.state_dict()}, path)
    saved = torch.load(path, weights_only=True)  # what a checkpoint holds loads without code
    resumed = Schedule(node, optimizer(), length)  # a restarted job: built afresh, then loaded
    resumed.optimizer.load_state_dict(saved["optimizer"])
    resumed.load_state_dict(saved)
    assert rates(resumed, list(range(6, 13))) == expected[5:]
    Schedule(node, optimizer(), length).load_state_dict({})  # a checkpoint from before the group: no error


def test_a_scheduler_target_that_is_no_scheduler_is_refused_in_one_line() -> None:
    node = scheduler_node("scheduler._target_=builtins.repr")  # takes the optimizer, returns a str
    with pytest.raises(ConfigError, match=r"scheduler._target_=builtins.repr returned a str, which has neither"):
        Schedule(node, optimizer(), RunLength.of(node, epochs=1, max_steps=0, steps_per_epoch=1))


@pytest.mark.parametrize("moved", ["optim.scheduler=constant", "optim.warmup_epochs=1"])
def test_the_old_optim_schedule_keys_are_refused_with_the_new_place(moved: str) -> None:
    with pytest.raises(ConfigError, match=r"is now scheduler.*scheduler=cosine \| constant"):
        to_train_config(compose_config([f"+{moved}"]))


def test_cosine_factor_is_clamped_outside_the_run() -> None:
    assert Cosine.factor(-1.0) == 1.0 and Cosine.factor(2.0) == 0.0

"""engine/schedule.py: the learning rate of each step, a warm-up then the scheduler group's `_target_`:
the project's (a factor of progress in epochs, or in steps with trainer.max_steps) or any stepped one
(torch.optim.lr_scheduler.*), whose resume continues exactly."""

from __future__ import annotations

import math

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.schedule import Cosine, RunLength, Schedule

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


def resume_step_lr(tmp_path, before: list[str], after: list[str], steps_before: int, lr: float = 0.4,
                   accepted: tuple[str, ...] = ()) -> Schedule:  # fmt: skip
    """A StepLR run of `steps_before` steps checkpointed, then resumed by a schedule built from `after`
    (with optim.lr `lr`), the resumed optimizer's state loaded."""
    node = step_lr(*before)
    length = RunLength.of(node, epochs=1, max_steps=12, steps_per_epoch=12)
    first = Schedule(node, optimizer(), length)
    rates(first, list(range(1, steps_before + 1)))
    config = {"optim": {"lr": 0.4}, "scheduler": node}
    torch.save({**first.state_dict(), "optimizer": first.optimizer.state_dict(), "config": config, "step": 5},
               tmp_path / "state.pt")  # fmt: skip
    saved = torch.load(tmp_path / "state.pt", weights_only=True)
    node = step_lr(*after)
    resumed = Schedule(node, optimizer(lr), RunLength.of(node, 1, 12, 12), accepted=accepted)
    resumed.optimizer.load_state_dict(saved["optimizer"])
    resumed.load_state_dict(saved)
    return resumed


def test_a_resume_that_changes_a_started_torch_schedulers_settings_is_refused_in_one_line(tmp_path) -> None:
    """Its saved state holds its base rates and step_size: loaded, it would silently override the new ones."""
    with pytest.raises(ConfigError) as refused:
        resume_step_lr(tmp_path, ["scheduler.warmup_steps=2"], ["scheduler.warmup_steps=2", "scheduler.step_size=3"],
                       steps_before=5, lr=0.1)  # fmt: skip
    assert str(refused.value) == (
        "the checkpoint's scheduler was stepped with other settings (optim.lr: checkpoint 0.4, config 0.1; "
        "scheduler.step_size: checkpoint 2, config 3): its saved state would override them. Resume with the "
        "checkpoint's values, give a new run dir (RUN_DIR, or RUN_NAME on many nodes), or accept them, the scheduler "
        "starting afresh from them at this step: checkpoint.allow_changes=[optim.lr,scheduler.step_size]"
    )
    same = resume_step_lr(tmp_path, ["scheduler.warmup_steps=2"], ["scheduler.warmup_steps=2"], steps_before=5)
    assert same.started and same.scheduler.last_epoch == 4, "unchanged: continued (stepped after steps 2 to 5)"


def test_accepted_changes_restart_the_torch_scheduler_from_them(tmp_path, caplog) -> None:
    caplog.set_level("INFO")
    after = ["scheduler.warmup_steps=2", "scheduler.step_size=3"]
    resumed = resume_step_lr(tmp_path, ["scheduler.warmup_steps=2"], after, 5, lr=0.1, accepted=("optim", "scheduler"))
    assert rates(resumed, list(range(6, 11))) == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.05]), "0.1, halved every 3"
    assert "scheduler: optim.lr, scheduler.step_size changed (accepted by checkpoint.allow_changes): " \
           "torch.optim.lr_scheduler.StepLR starts afresh from the new settings at step 5" in caplog.text  # fmt: skip


def test_a_torch_scheduler_resumed_within_its_warm_up_takes_changed_settings_without_a_word(tmp_path) -> None:
    """Not handed over to yet, its saved state is that of a new one: the new settings are simply used."""
    resumed = resume_step_lr(tmp_path, ["scheduler.warmup_steps=6"], ["scheduler.warmup_steps=6",
                             "scheduler.step_size=3"], steps_before=5, lr=0.1)  # fmt: skip
    assert rates(resumed, list(range(6, 11))) == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.05]), "halved every 3"


@pytest.mark.parametrize("scheduler", ["scheduler=cosine", "+scheduler.step_size=2"])
def test_a_resume_takes_the_optimizers_settings_from_the_config_not_the_checkpoint(scheduler: str) -> None:
    """torch's Optimizer.load_state_dict brings back the saved weight_decay, momentum...: a changed one
    would be listed as accepted and silently ignored."""
    if scheduler.startswith("+"):
        scheduler = f"scheduler._target_=torch.optim.lr_scheduler.StepLR {scheduler}"
    node = scheduler_node(*scheduler.split())
    old, new = optimizer(), optimizer()
    for group in new.param_groups:
        group.update(momentum=0.5, weight_decay=group["weight_decay"] * 10)
    schedule = Schedule(node, new, RunLength(total=4, warmup=0, by_steps=True))
    configured = [{k: v for k, v in group.items() if k != "params"} for group in new.param_groups]
    new.load_state_dict(old.state_dict())
    assert new.param_groups[0]["weight_decay"] == 1e-4, "what torch does"
    schedule.load_state_dict({})
    assert [{k: v for k, v in group.items() if k != "params"} for group in new.param_groups] == configured


def test_a_plateau_scheduler_is_stepped_with_the_monitored_figure_after_each_validation_past_the_warm_up() -> None:
    node = scheduler_node("scheduler._target_=torch.optim.lr_scheduler.ReduceLROnPlateau", "+scheduler.patience=0",
                          "+scheduler.factor=0.5", "scheduler.warmup_steps=2")  # fmt: skip
    schedule = Schedule(node, optimizer(), RunLength(total=10, warmup=2, by_steps=True))
    assert schedule.needs_metric
    found = []
    for step, figure in zip(range(1, 8), [9.0, 1.0, 1.0, 2.0, 0.5, 0.7, 0.7], strict=True):
        found += rates(schedule, [step])  # no step() without its figure: no TypeError
        schedule.after_validation(figure)  # a validation every step
    assert found == pytest.approx([0.2, 0.4, 0.4, 0.2, 0.1, 0.1, 0.05]), "the warm-up's figures ignored"
    schedule.check_monitor("val_loss", "min")
    refusal = (r"ReduceLROnPlateau has mode=min, but it is stepped with checkpoint.monitor=val_acc, which "
               r"checkpoint.mode=max ranks: give \+scheduler.mode=max$")  # fmt: skip
    with pytest.raises(ConfigError, match=refusal):
        schedule.check_monitor("val_acc", "max")
    assert not Schedule(step_lr(), optimizer(), RunLength(10, 0, True)).needs_metric


def test_a_warm_up_longer_than_the_run_is_said() -> None:
    node = scheduler_node("scheduler.warmup_steps=8")
    short = Schedule(node, optimizer(), RunLength.of(node, epochs=1, max_steps=5, steps_per_epoch=3))
    assert short.warmup_outlasts_run() == (
        "the warm-up (8 steps) is longer than the run (trainer.max_steps=5): the learning rate ends at 0.62 of "
        "optim.lr and never reaches it; shorten scheduler.warmup_steps or warmup_epochs, or train longer"
    )
    assert max(rates(short, [1, 2, 3, 4, 5])) == pytest.approx(0.4 * 5 / 8)
    in_epochs = Schedule(node, optimizer(), RunLength.of(node, epochs=2, max_steps=0, steps_per_epoch=3))
    assert in_epochs.warmup_outlasts_run().startswith("the warm-up (2.67 epochs) is longer than the run "
                                                      "(trainer.epochs=2)")  # fmt: skip
    exact = Schedule(node, optimizer(), RunLength.of(node, epochs=1, max_steps=8, steps_per_epoch=3))
    assert exact.warmup_outlasts_run() == "", "it reaches optim.lr at the last step"


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

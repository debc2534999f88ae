"""engine/monitor.py: checkpoint.monitor ranked (keep_best's steps, best first) and counted for early
stopping (trainer.early_stop_patience, early_stop_min_delta), its state a plain-valued round trip."""

from __future__ import annotations

import math

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.engine.monitor import Monitor


def watch(values: list[float], mode: str = "min", keep_best: int = 2, patience: int = 0, delta: float = 0.0,
          start: int = 0) -> tuple[Monitor, list[bool]]:  # fmt: skip
    monitor = Monitor("val_loss", mode, keep_best, patience, delta)
    return monitor, [monitor.observe(start + 10 * (i + 1), {"val_loss": v}) for i, v in enumerate(values)]


def test_the_best_are_ranked_best_first_and_a_new_one_is_said_to_be_kept() -> None:
    monitor, kept = watch([0.9, 0.5, 0.7, 0.4, 0.8])
    assert kept == [True, True, True, True, False]
    assert monitor.kept_steps() == [40, 20] and monitor.best == [(40, 0.4), (20, 0.5)]
    monitor, kept = watch([0.9, 0.5, 0.7, 0.95], mode="max", keep_best=1)
    assert monitor.kept_steps() == [40] and kept == [True, False, False, True]


def test_of_equal_values_the_earlier_stays() -> None:
    monitor, kept = watch([0.5, 0.5, 0.5], keep_best=1)
    assert monitor.kept_steps() == [10] and kept == [True, False, False]


def test_patience_counts_validations_without_an_improvement_larger_than_min_delta() -> None:
    monitor, _ = watch([1.0, 0.95, 0.92, 0.91], patience=3, delta=0.1)
    assert monitor.stopped.startswith("val_loss has not improved for 3 validations (patience 3; best 0.91 at step 40)")
    monitor, _ = watch([1.0, 0.95, 0.8, 0.79], patience=3, delta=0.1)
    assert not monitor.stopped and monitor.bad == 1 and monitor.reference == 0.8, "0.8 improved by more than 0.1"
    monitor, _ = watch([1.0, 1.1, 1.2], patience=2, mode="max")
    assert not monitor.stopped and monitor.bad == 0


def test_a_value_that_is_not_finite_never_improves_and_is_never_kept() -> None:
    monitor, kept = watch([math.nan, 0.5, math.inf], patience=2)
    assert kept == [False, True, False] and monitor.kept_steps() == [20] and monitor.bad == 1


def test_an_early_stop_on_figures_that_are_not_finite_says_so() -> None:
    monitor, _ = watch([0.5, math.nan, 0.6, math.nan], patience=3)
    assert monitor.stopped == ("val_loss has not improved for 3 validations (patience 3; best 0.5 at step 10; 2 of "
                               "them NaN or infinite)")  # fmt: skip
    monitor, _ = watch([0.5, 0.6, 0.7], patience=2)
    assert "NaN" not in monitor.stopped, "said only where there were some"
    monitor, _ = watch([0.5, math.nan, 0.4, 0.6, 0.7], patience=2)
    assert monitor.stopped.endswith("best 0.4 at step 30)"), "an improvement starts the count afresh"


def test_keep_best_off_keeps_nothing_but_early_stopping_still_counts() -> None:
    monitor, kept = watch([0.5, 0.6, 0.7], keep_best=0, patience=2)
    assert kept == [False] * 3 and monitor.kept_steps() == [] and monitor.stopped
    assert not Monitor("val_loss", "min", 0, 0, 0.0).enabled
    assert Monitor("val_loss", "min", 0, 0, 0.0).observe(5, {}) is False, "off: no figure is even read"


def test_the_state_round_trips_through_a_weights_only_file(tmp_path) -> None:
    monitor, _ = watch([0.9, 0.5, 0.7], patience=5, delta=0.01)
    torch.save(monitor.state_dict(), tmp_path / "monitor.pt")
    resumed = Monitor("val_loss", "min", 2, 5, 0.01)
    resumed.load_state_dict(torch.load(tmp_path / "monitor.pt", weights_only=True))
    assert (resumed.best, resumed.reference, resumed.bad, resumed.stopped) == (monitor.best, 0.5, 1, "")
    assert [resumed.observe(40, {"val_loss": 0.6}), monitor.observe(40, {"val_loss": 0.6})] == [True, True]
    assert resumed.state_dict() == monitor.state_dict()
    fresh = Monitor("val_loss", "min", 2, 5, 0.01)
    fresh.load_state_dict({})  # a checkpoint from before the monitor
    assert (fresh.best, fresh.reference, fresh.bad) == ([], None, 0)


def test_a_monitor_the_validation_does_not_give_is_refused_naming_those_it_does() -> None:
    with pytest.raises(ConfigError, match=r"checkpoint.monitor=val_acc is not a figure .* gives val_loss, val_f1"):
        Monitor("val_acc", "max", 1, 0, 0.0).check_names(["val_loss", "val_f1"])
    Monitor("val_acc", "max", 0, 0, 0.0).check_names(["val_acc"])


def saved(monitor: Monitor, step: int, **checkpoint: object) -> dict:
    """A checkpoint's payload as the monitor reads it: its state, and the config it was trained with."""
    config = {"monitor": monitor.key, "mode": monitor.mode, "keep_best": monitor.keep_best, **checkpoint}
    return {**monitor.state_dict(), "step": step, "config": {"checkpoint": config}}


@pytest.mark.parametrize(("key", "mode"), [("val_acc", "max"), ("val_loss", "max")])
def test_a_resume_that_changes_the_monitor_or_its_mode_ranks_and_counts_afresh_and_says_so(key, mode, caplog) -> None:
    caplog.set_level("INFO")
    before, _ = watch([0.9, 0.5, 0.7], patience=3)  # val_loss, min: best 0.5 at step 20, one bad validation
    resumed = Monitor(key, mode, 2, 3, 0.0)
    resumed.load_state_dict(saved(before, 30))
    assert (resumed.best, resumed.reference, resumed.bad) == ([], None, 0), "the old figures do not rank the new"
    assert f"checkpoint.monitor changed (val_loss, min -> {key}, {mode}): the best checkpoints and the early-" \
           "stopping count start afresh after step 30" in caplog.text  # fmt: skip
    assert resumed.observe(40, {key: 0.1}) and resumed.kept_steps() == [40]
    same = Monitor("val_loss", "min", 2, 3, 0.0)
    same.load_state_dict(saved(before, 30))
    assert (same.best, same.bad) == (before.best, 1), "unchanged: carried over"
    stopped, _ = watch([0.9, 0.95, 0.97], patience=2)
    finished = Monitor(key, mode, 2, 3, 0.0)
    finished.load_state_dict(saved(stopped, 30))
    assert finished.best == stopped.best and finished.stopped, "a run that stopped early keeps its best as they are"


def test_keep_best_switched_on_at_a_resume_ranks_only_what_comes_after(caplog) -> None:
    """With keep_best off, a validation's step is ranked (for early stopping) but no checkpoint is kept for it:
    switched on, best.json must not list it."""
    caplog.set_level("INFO")
    before, _ = watch([0.9, 0.5, 0.7], keep_best=0, patience=5)
    assert before.best == [(20, 0.5)]
    resumed = Monitor("val_loss", "min", 2, 5, 0.0)
    resumed.load_state_dict(saved(before, 30))
    assert (resumed.best, resumed.reference, resumed.bad) == ([], 0.5, 1), "the early-stopping count carries on"
    assert "checkpoint.keep_best switched on: the best checkpoints are ranked from the validations after step 30" \
        in caplog.text  # fmt: skip
    more = Monitor("val_loss", "min", 3, 5, 0.0)  # 2 -> 3: those kept are kept
    kept, _ = watch([0.9, 0.5, 0.7])
    more.load_state_dict(saved(kept, 30))
    assert more.best == kept.best == [(20, 0.5), (30, 0.7)]

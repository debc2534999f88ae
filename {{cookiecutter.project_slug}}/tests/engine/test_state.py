"""engine/state.py: whether a run at a state (the trainer's, or a checkpoint's payload) has finished."""

from __future__ import annotations

from {{cookiecutter.package_name}}.engine.state import TrainState, run_finished


def test_a_run_finishes_after_its_epochs_at_max_steps_or_when_stopped_early() -> None:
    state = TrainState(epoch=2, step=10, samples_in_epoch=0)
    assert run_finished(state.state_dict(), epochs=2, max_steps=0)
    assert not run_finished(state.state_dict(), epochs=3, max_steps=0)
    assert not run_finished({**state.state_dict(), "samples_in_epoch": 8}, epochs=2, max_steps=0), "mid-epoch"
    assert run_finished(state.state_dict(), epochs=9, max_steps=10), "max_steps decides where set"
    assert not run_finished(state.state_dict(), epochs=1, max_steps=11)
    stopped = {**state.state_dict(), "monitor": {"stopped": "val_loss did not improve"}}
    assert run_finished(stopped, epochs=9, max_steps=0)


def test_a_state_round_trips_through_its_state_dict() -> None:
    resumed = TrainState()
    resumed.load_state_dict(TrainState(epoch=1, step=7, samples_in_epoch=24).state_dict())
    assert resumed == TrainState(epoch=1, step=7, samples_in_epoch=24)

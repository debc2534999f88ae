"""engine/state.py: where training stands, saved and restored."""

from __future__ import annotations

from {{cookiecutter.package_name}}.engine.state import TrainState


def test_a_state_round_trips_through_its_state_dict() -> None:
    resumed = TrainState()
    resumed.load_state_dict(TrainState(epoch=1, step=7, samples_in_epoch=24).state_dict())
    assert resumed == TrainState(epoch=1, step=7, samples_in_epoch=24)

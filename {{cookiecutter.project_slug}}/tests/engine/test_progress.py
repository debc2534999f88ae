"""engine/progress.py: an epoch's micro-batches grouped into optimizer steps (what TrainState counts is
tested with the resumes: tests/engine/test_trainer.py, tests/engine/checkpoint/test_manager.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.engine.progress import optimizer_steps

from ..helpers import trainer


@pytest.mark.parametrize(("accum", "counts", "reals"), [(1, [1] * 4, [24, 24, 24, 8]), (3, [3, 1], [72, 8])])
def test_optimizer_steps_group_the_micro_batches_of_the_epoch(tmp_path: Path, accum, counts, reals) -> None:
    sampler = trainer(tmp_path, "data.train_size=80", "data.batch_size=24").data.sampler
    sampler.set_epoch(0)
    batches = iter(range(10))  # stands in for the loader: more than the epoch holds
    steps = list(optimizer_steps(batches, sampler, accum))
    assert [step.count for step in steps] == counts and [step.real_samples for step in steps] == reals
    assert next(batches) == 0, "lazy: nothing is read before its step is trained"

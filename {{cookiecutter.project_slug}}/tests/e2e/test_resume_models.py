"""Every model the template ships, under every strategy: a worker SIGKILLed mid-run, torchrun's
restart resumes it, and the run ends bit-identical to an uninterrupted one (weights, buffers,
optimizer state, and the per-rank state of a callback, tests/engine/test_callbacks.py's NoisyMean).
small_cnn and resnet18 have BatchNorm buffers; gpt has dropout.

Two pairs are the subject of tests of their own, which also kill mid-run and compare bit for bit:
small_cnn under ddp (tests/e2e/test_resume.py, killed three times) and gpt under fsdp
(tests/e2e/test_fsdp.py, killed during a sharded save)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from .jobs import assert_bit_identical, checkpoint_of, finish, read_checkpoint, start, steps_saved, wait_for, worker_pid

pytestmark = pytest.mark.slow

# Each job 8 optimizer steps on 2 processes, a checkpoint every 2; the kill lands after step 2's.
JOBS = {
    "small_cnn": ["task=classification", "model=small_cnn", "data=synthetic", "data.train_size=256",
                  "data.val_size=50", "data.batch_size=32", "trainer.epochs=2"],
    "resnet18": ["task=classification", "model=resnet18", "data=synthetic", "data.train_size=64",
                 "data.val_size=16", "data.batch_size=4", "trainer.epochs=1"],
    "gpt": ["task=language_model", "model.width=32", "model.layers=2", "model.dropout=0.1",
            "data.train_samples=192", "data.val_samples=50", "trainer.epochs=1"],
}  # fmt: skip
COMMON = ["checkpoint.every_n_steps=2", "checkpoint.keep_last=20", "trainer.log_every_n_steps=2",
          "+callbacks.mean._target_=tests.engine.test_callbacks.NoisyMean", "+callbacks.mean.seed=5"]  # fmt: skip
LAST_STEP = 8


@pytest.mark.parametrize(("model", "strategy"), [("resnet18", "ddp"), ("resnet18", "fsdp"), ("small_cnn", "fsdp"),
                                               ("gpt", "ddp")])  # fmt: skip
def test_a_sigkill_resumes_bit_identically(tmp_path: Path, model: str, strategy: str) -> None:
    job = [*JOBS[model], *COMMON, f"strategy={strategy}"]
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    code, output = finish(start(reference, 2, *job))
    assert code == 0 and steps_saved(reference)[-1] == LAST_STEP, output[-3000:]
    proc = start(killed, 2, *job)
    wait_for(lambda: 2 in steps_saved(killed), "the checkpoint of step 2")
    os.kill(worker_pid(killed, 1), signal.SIGKILL)
    code, output = finish(proc)
    assert code == 0 and "resumed from" in output, output[-3000:]
    assert_bit_identical(reference, killed, step=LAST_STEP)
    assert read_checkpoint(checkpoint_of(killed, LAST_STEP))["callbacks"][1]["mean"]["count"] == LAST_STEP

"""A model the template ships, killed for real: a worker SIGKILLed mid-run, torchrun's restart resumes
it, and the run ends bit-identical to an uninterrupted one (weights, buffers, optimizer state, and the
per-rank state of a callback, tests/engine/test_callbacks.py's NoisyMean). gpt under ddp here, with
dropout (its generators' states matter).

The other models and strategies, each killed for real by a test of its own: small_cnn under ddp
(tests/e2e/test_resume.py, killed three times), gpt under fsdp (tests/e2e/test_fsdp.py, killed during
a sharded save), a user's model with dropout (test_own_model.py), hsdp (test_hsdp.py). The state each
model and strategy carries across a resume, bit for bit, in-process on two ranks: resnet50 under ddp and
resnet18 under fsdp (tests/engine/test_trainer.py), small_cnn under both, on another world size too
(the same file), a callback's per-rank state under both (tests/engine/test_callbacks.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from .jobs import assert_bit_identical, checkpoint_of, finish, read_checkpoint, start, steps_saved, wait_for, worker_pid

pytestmark = pytest.mark.slow

# 8 optimizer steps on 2 processes, a checkpoint every 2; the kill lands after step 2's.
JOB = ["task=language_model", "model.width=32", "model.layers=2", "model.dropout=0.1", "data.train_samples=192",
       "data.val_samples=50", "trainer.epochs=1", "strategy=ddp"]  # fmt: skip
COMMON = ["checkpoint.every_n_steps=2", "checkpoint.keep_last=20", "trainer.log_every_n_steps=2",
          "+callbacks.mean._target_=tests.engine.test_callbacks.NoisyMean", "+callbacks.mean.seed=5"]  # fmt: skip
LAST_STEP = 8


def test_a_sigkill_resumes_bit_identically(tmp_path: Path) -> None:
    job = [*JOB, *COMMON]
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

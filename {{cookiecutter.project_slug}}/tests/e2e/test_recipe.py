"""The training recipe through scripts/run_single.sh, as users run it (docs/recipe.md): early stopping
on 2 and 3 processes (every rank at one step, exit 0, a relaunch has finished), the best checkpoint
exported and fine-tuned from with a new 3-class head, a step-counted run with validations, keep_best,
the EMA and a torch scheduler SIGKILLed between two validations that ends as the uninterrupted one (fsdp),
and goes on on another number of processes."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
import torch

from ..helpers import PYTHON, run
from .jobs import (
    assert_bit_identical,
    checkpoint_of,
    finish,
    read_checkpoint,
    read_metrics,
    start,
    steps_saved,
    wait_for,
    worker_pid,
)

pytestmark = pytest.mark.slow

IMAGES = ["task=classification", "model=small_cnn", "data=synthetic", "model.width=8", "data.val_size=40"]
# Nothing improves by 100: with a validation every 2 steps and patience 2, every run stops at step 6.
STOPS = ["trainer.val_every_n_steps=2", "trainer.early_stop_patience=2", "trainer.early_stop_min_delta=100"]


def stopped_at(run_dir: Path) -> set[str]:
    """Each rank's 'stopping early at step N' (from its own log file)."""
    return {match for path in (run_dir / "logs").glob("rank_*.log")
            for match in re.findall(r"stopping early at step (\d+)", path.read_text())}  # fmt: skip


@pytest.fixture(scope="module")
def best_weights(tmp_path_factory) -> Path:
    """A 10-class run on 2 processes that stops early, relaunched (it has finished), its best checkpoint
    exported as a user's weights file."""
    root = tmp_path_factory.mktemp("stopped")
    job = [*IMAGES, "data.train_size=256", "data.batch_size=16", "trainer.epochs=4", "checkpoint.keep_best=1", *STOPS]
    code, output = finish(start(root / "run", 2, *job))
    assert code == 0 and "stopping early at step 6: val_loss has not improved for 2 validations" in output, output
    assert stopped_at(root / "run") == {"6"} and len(list((root / "run" / "logs").glob("rank_*.log"))) == 2
    code, output = finish(start(root / "run", 2, *job))
    assert code == 0 and "training had already finished at step 6 (stopped early: val_loss" in output, output
    exported = run([PYTHON, "-m", "{{cookiecutter.package_name}}.export", str(root / "run" / "checkpoints" / "best"),
                    str(root / "weights.pt")])  # fmt: skip
    validations = [record for record in read_metrics(root / "run") if record["kind"] == "val"]
    best = min(validations, key=lambda record: record["val_loss"])["step"]  # keep_best ranks without min_delta
    assert [r["step"] for r in validations] == [2, 4, 6] and f"weights at step {best}: sha256" in exported.stdout
    return root / "weights.pt"


def test_early_stopping_on_three_processes_with_the_language_model_by_steps(best_weights, tmp_path: Path) -> None:
    job = ["task=language_model", "model.width=32", "model.layers=2", "data.block_size=32", "data.train_samples=960",
           "data.val_samples=30", "trainer.max_steps=40", "trainer.activation_checkpointing=true", *STOPS]  # fmt: skip
    code, output = finish(start(tmp_path / "lm", 3, *job))
    assert code == 0 and "activation checkpointing: 2 blocks (Block)" in output, output[-3000:]
    assert stopped_at(tmp_path / "lm") == {"6"} and len(list((tmp_path / "lm" / "logs").glob("rank_*.log"))) == 3


RECIPE = [*IMAGES, "data.num_classes=3", "data.train_size=640", "data.batch_size=16", "trainer.max_steps=20",
          "trainer.val_every_n_steps=10", "checkpoint.every_n_steps=4", "checkpoint.keep_last=1",
          "checkpoint.keep_best=1", "trainer.ema.decay=0.9", "scheduler._target_=torch.optim.lr_scheduler.StepLR",
          "+scheduler.step_size=3", "+scheduler.gamma=0.8", "scheduler.warmup_steps=2"]  # fmt: skip


def test_a_fine_tuned_recipe_run_sigkilled_between_validations_ends_as_the_uninterrupted_one(
    best_weights: Path, tmp_path: Path
) -> None:
    """Under fsdp (ddp's resume of the same recipe: tests/engine/test_recipe.py, on two gloo ranks)."""
    job = [*RECIPE, "strategy=fsdp", f"model.init_from={best_weights}"]
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    code, output = finish(start(reference, 2, *job))
    head = "skipped, shape differs: 7.weight [10, 32]->[3, 32], 7.bias [10]->[3]"
    assert code == 0 and f"initialised from {best_weights}: 18 of 20 tensors loaded; {head}" in output, output[-3000:]
    proc = start(killed, 2, *job)
    wait_for(lambda: 4 in steps_saved(killed), "the checkpoint of step 4")
    os.kill(worker_pid(killed, 1), signal.SIGKILL)  # 20 steps an epoch: the validations are at 10 and 20
    code, output = finish(proc)
    resumed = re.findall(r"resumed from \S+: epoch 0, step (\d+)", output)
    assert code == 0 and resumed and int(resumed[0]) < 10, output[-3000:]
    assert "model.init_from is not read: the run resumes its own checkpoint" in output
    assert_bit_identical(reference, killed, step=20)
    ends = [read_checkpoint(checkpoint_of(run_dir, 20)) for run_dir in (reference, killed)]
    assert ends[0]["ema"].keys() == ends[1]["ema"].keys() and ends[0]["scheduler"] == ends[1]["scheduler"]
    assert all(torch.equal(ends[0]["ema"][name], ends[1]["ema"][name]) for name in ends[0]["ema"])
    validations = [[r for r in read_metrics(run_dir) if r["kind"] == "val"] for run_dir in (reference, killed)]
    assert validations[0] == validations[1] and [r["step"] for r in validations[0]] == [10, 20]
    best = [json.loads((run_dir / "checkpoints" / "best.json").read_text()) for run_dir in (reference, killed)]
    assert best[0] == best[1] and checkpoint_of(killed, best[1]["steps"][0]).exists()
    # The same run goes on on one process: its shards and its EMA resharded.
    code, output = finish(start(killed, 1, *job, "trainer.max_steps=22"))
    assert code == 0 and re.search(r"resumed from \S+: epoch 1, step 20, .*saved by 2 processes, now 1", output)
    assert steps_saved(killed)[-1] == 22, output[-3000:]

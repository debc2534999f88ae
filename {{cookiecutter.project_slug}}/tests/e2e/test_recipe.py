"""The training recipe through scripts/run_single.sh, as users run it (docs/recipe.md): early stopping
on 2 processes (every rank at one step, exit 0), the best checkpoint
exported and fine-tuned from with a new 3-class head, a step-counted run with validations, keep_best,
the EMA and a torch scheduler under the widest strategy that goes on on another number of processes. Early stopping
decided by the global figures on every rank: tests/engine/test_recipe.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ..helpers import PYTHON, WIDEST, run
from .jobs import checkpoint_of, finish, read_checkpoint, read_metrics, start, steps_saved

pytestmark = pytest.mark.slow

IMAGES = ["task=classification", "model=small_cnn", "data=synthetic", "model.width=8", "data.image_size=16",
          "data.val_size=40"]  # fmt: skip
# Nothing improves by 100: with a validation every 2 steps and patience 2, every run stops at step 6.
STOPS = ["trainer.val_every_n_steps=2", "trainer.early_stop_patience=2", "trainer.early_stop_min_delta=100"]


def stopped_at(run_dir: Path) -> set[str]:
    """Each rank's 'stopping early at step N' (from its own log file)."""
    return {match for path in (run_dir / "logs").glob("rank_*.log")
            for match in re.findall(r"stopping early at step (\d+)", path.read_text())}  # fmt: skip


@pytest.fixture(scope="module")
def best_weights(tmp_path_factory) -> Path:
    """A 10-class run on 2 processes that stops early, its best checkpoint exported as a user's weights
    file."""
    root = tmp_path_factory.mktemp("stopped")
    job = [*IMAGES, "data.train_size=256", "data.batch_size=16", "trainer.epochs=4", "checkpoint.keep_best=1", *STOPS]
    code, output = finish(start(root / "run", 2, *job))
    assert code == 0 and "stopping early at step 6: val_loss has not improved for 2 validations" in output, output
    assert stopped_at(root / "run") == {"6"} and len(list((root / "run" / "logs").glob("rank_*.log"))) == 2
    # (A relaunch of the run that stopped early has finished and trains nothing: tests/engine/test_trainer.py.)
    exported = run([PYTHON, "-m", "{{cookiecutter.package_name}}.export", str(root / "run" / "checkpoints" / "best"),
                    str(root / "weights.pt")])  # fmt: skip
    validations = [record for record in read_metrics(root / "run") if record["kind"] == "val"]
    best = min(validations, key=lambda record: record["val_loss"])["step"]  # keep_best ranks without min_delta
    assert [r["step"] for r in validations] == [2, 4, 6] and f"weights at step {best}: sha256" in exported.stdout
    return root / "weights.pt"


RECIPE = [*IMAGES, "data.num_classes=3", "data.train_size=640", "data.batch_size=16", "trainer.max_steps=20",
          "trainer.val_every_n_steps=10", "checkpoint.every_n_steps=4", "checkpoint.keep_last=1",
          "checkpoint.keep_best=1", "trainer.ema.decay=0.9", "scheduler._target_=torch.optim.lr_scheduler.StepLR",
          "+scheduler.step_size=3", "+scheduler.gamma=0.8", "scheduler.warmup_steps=2"]  # fmt: skip


def test_a_fine_tuned_recipe_run_goes_on_on_another_number_of_processes(best_weights: Path, tmp_path: Path) -> None:
    """Under the widest strategy (helpers.WIDEST), from the exported best weights with a new head: validations,
    keep_best, the EMA and a torch scheduler; then the same run goes on on one process, its shards and EMA
    resharded where they are sharded, init_from not read. A recipe run killed between validations ends as the
    uninterrupted one: tests/engine/test_recipe.py (each strategy on two gloo ranks, and alone); a real
    SIGKILL and torchrun's restart: tests/e2e/test_resume.py."""
    job = [*RECIPE, f"strategy={WIDEST}", f"model.init_from={best_weights}"]
    run_dir = tmp_path / "run"
    code, output = finish(start(run_dir, 2, *job))
    head = "skipped, shape differs: 7.weight [10, 32]->[3, 32], 7.bias [10]->[3]"
    assert code == 0 and f"initialised from {best_weights}: 18 of 20 tensors loaded; {head}" in output, output[-3000:]
    assert [r["step"] for r in read_metrics(run_dir) if r["kind"] == "val"] == [10, 20]
    best = json.loads((run_dir / "checkpoints" / "best.json").read_text())
    assert len(best["steps"]) == 1 and checkpoint_of(run_dir, best["steps"][0]).exists()
    end = read_checkpoint(checkpoint_of(run_dir, 20))
    assert end["ema"] and end["scheduler"], "the EMA and the scheduler are saved"
    code, output = finish(start(run_dir, 1, *job, "trainer.max_steps=22"))
    assert code == 0 and re.search(r"resumed from \S+: epoch 1, step 20, .*saved by 2 processes, now 1", output)
    assert "model.init_from is not read: the run resumes its own checkpoint" in output
    assert steps_saved(run_dir)[-1] == 22, output[-3000:]

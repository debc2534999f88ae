"""The language model, the second built-in task: it learns and evaluates exactly (its bit-exact resume
after a SIGKILL, dropout on: tests/e2e/test_fsdp.py; a ddp one with dropout: test_own_model.py)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.datasets import text

from ..helpers import PYTHON, run
from .jobs import finish, read_metrics, start, torchrun

pytestmark = pytest.mark.slow

# 2 processes x 12 windows a step, 100 steps an epoch; dropout on, so the generator states matter.
LM = ["task=language_model", "data.train_samples=2400", "data.val_samples=301", "model.dropout=0.1",
      "trainer.log_every_n_steps=10", "checkpoint.every_n_steps=10", "checkpoint.keep_last=20"]  # fmt: skip


def unigram_entropy_nats(data: torch.Tensor) -> float:
    counts = torch.bincount(data.long(), minlength=256).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, str]:
    """The 2-process run (one epoch: its validation is 5% under the bar on this CPU, 8% after a second), and its
    output."""
    run_dir = tmp_path_factory.mktemp("lm") / "reference"
    code, output = finish(start(run_dir, 2, *LM, "trainer.epochs=1"))
    assert code == 0, output[-3000:]
    return run_dir, output


@pytest.fixture(scope="module")
def reference(trained) -> Path:
    return trained[0]


def test_language_model_learns_well_below_the_unigram_entropy(reference: Path) -> None:
    _, val = text(None, block_size=64, train_samples=1, val_samples=1)
    entropy = unigram_entropy_nats(val.data)
    final = [r for r in read_metrics(reference) if r["kind"] == "val"][-1]
    assert final["val_loss"] < 0.8 * entropy, (final, entropy)
    assert final["val_bpb"] == pytest.approx(final["val_loss"] / math.log(2))
    assert final["val_samples"] == 301


def test_language_model_evaluation_is_identical_at_any_world_size(trained) -> None:
    """The training run's last validation on 2 processes, and eval.py on 3 of the same checkpoint, agree to
    the last digit printed (1 process and 3: tests/e2e/test_training.py's eval.py test; the figures' sums
    at any world size: tests/engine/test_evaluate.py)."""
    run_dir, output = trained
    checkpoint = run_dir / "checkpoints" / "step_00000100.pt"
    on_two = re.findall(r"final: (val_loss=\S+ val_bpb=\S+ val_samples=\d+)", output)
    on_three = torchrun("eval.py", 3, f"ckpt_path={checkpoint}").stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"val_loss=[\d.]+ val_bpb=[\d.]+ val_samples=301", on_three), on_three
    assert on_two == [on_three], (on_two, on_three)


def test_language_model_metrics_reach_the_plot(reference: Path) -> None:
    proc = run([PYTHON, "scripts/plot_metrics.py", str(reference)])
    assert proc.stdout.strip().endswith("metrics.png") and (reference / "metrics.png").stat().st_size > 10_000

"""Speed options of the training step in real jobs on CPU: compile, the benchmark (bf16 and channels_last).
Accumulation's one gradient reduction per optimizer step: tests/engine/test_exact_losses.py. bf16
accumulation with clipping and channels_last, resumed between optimizer steps bit for bit:
tests/engine/test_trainer.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ..helpers import SMALL, run
from .jobs import read_metrics, torchrun


@pytest.mark.slow
def test_compiled_model_trains_and_saves_plain_weights(tmp_path: Path) -> None:
    # torch.compile on CPU builds C++ kernels (about 40 s here): the smallest job that compiles.
    proc = run(["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", f"RUN_DIR={tmp_path}", *SMALL,
                "trainer.compile=true", "trainer.epochs=1", "data.train_size=256", "data.val_size=64"])  # fmt: skip
    assert read_metrics(tmp_path)[-1]["kind"] == "val"
    compiled = re.search(r"torch.compile: (\d+) graphs compiled", proc.stderr)
    assert compiled and int(compiled.group(1)) >= 1, "trainer.compile=true must compile the model"
    saved = torch.load(tmp_path / "checkpoints" / "step_00000004.pt", weights_only=True)
    assert not any(key.startswith("_orig_mod.") for key in saved["model"]), "the checkpoint loads without compile"


def within_rounding(ratio: float, top: float, bottom: float) -> bool:
    """Whether a printed ratio (3 decimals) is the ratio of two printed rates (whole images/s): each
    rate is rounded by up to 0.5, which at CPU rates near 80 images/s moves their ratio by over 1%."""
    return (top - 0.5) / (bottom + 0.5) - 0.0005 <= ratio <= (top + 0.5) / (bottom - 0.5) + 0.0005


@pytest.mark.slow
def test_benchmark_smoke_mode_compares_the_loops(tmp_path: Path) -> None:
    proc = torchrun("benchmarks/bench.py", 2, "--smoke", "--precision=bf16", "--channels-last")
    lines = proc.stdout.splitlines()
    rates = {line.split()[0]: float(line.split()[1]) for line in lines if "images/s" in line}
    # Lightning is in the dev extra: its column runs (its Trainer on the same model and data), not "not installed".
    assert set(rates) == {"project", "bare", "lightning"} and all(rate > 0 for rate in rates.values()), proc.stdout
    beside = float(next(line for line in lines if line.startswith("ratio project/lightning ")).split()[-1])
    assert within_rounding(beside, rates["project"], rates["lightning"]), proc.stdout
    # The same work in both loops, and the project's really done: 3 steps of 2 x 32 images a round, the
    # warm-up round and one timed round.
    assert "work per round: project [192] images, bare [192] images; the project's trainer counted 6 " in proc.stdout
    ratio = float(next(line for line in lines if line.startswith("ratio project/bare ")).split()[-1])
    assert within_rounding(ratio, rates["project"], rates["bare"]), proc.stdout
    assert "precision bf16" in lines[0] and "checkpoint save holds training" in lines[-1], proc.stdout

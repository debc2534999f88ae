"""benchmarks/activation_checkpointing.py: checkpointing keeps far fewer activations and the same losses."""

from __future__ import annotations

import json

import pytest

from ..helpers import PYTHON, run


@pytest.mark.slow
def test_the_activation_benchmark_shows_checkpointing_keeping_fewer_activations_for_the_same_loss() -> None:
    tiny = ["--block-size", "64", "--batch", "2", "--steps", "1", "--warmup", "0", "--layers", "2", "--width", "32"]
    proc = run([PYTHON, "benchmarks/activation_checkpointing.py", "--device", "cpu", *tiny], timeout=240)
    rows = {row["mode"]: row for row in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}
    assert set(rows) == {"plain", "checkpointed"}, proc.stdout
    plain, checkpointed = rows["plain"], rows["checkpointed"]
    assert plain["blocks"] == 0 and checkpointed["blocks"] == 2, proc.stdout  # both of the GPT's blocks
    assert 0 < checkpointed["saved_bytes"] < 0.7 * plain["saved_bytes"], proc.stdout
    assert checkpointed["loss_diff"] < 1e-5, proc.stdout
    # The second step follows the recomputed gradients: the same within float noise.
    assert checkpointed["last_loss"] == pytest.approx(plain["last_loss"], abs=1e-5), proc.stdout
    assert plain["peak_bytes"] is None and plain["step_s"] > 0, proc.stdout  # no peak on CPU
    assert "activation checkpointing: saved activations" in proc.stdout

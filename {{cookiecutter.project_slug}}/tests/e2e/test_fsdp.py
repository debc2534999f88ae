"""strategy=fsdp, tested as users run it: an image classifier sharded over 2 processes, killed during a
sharded save, exported and evaluated from its shards (models of repeated blocks sharded one by one,
in-process: tests/engine/strategies/test_fsdp.py). A run switched to ddp and back, each way resumed with the
weights and the optimizer state it was saved with: tests/engine/strategies/test_fsdp.py; a sharded
checkpoint resumed on another world size, each sample once, bit for bit: that file too
(in bf16, the shards stay fp32: tests/engine/strategies/test_fsdp.py); a newest checkpoint whose shard
was cut in half set aside for the one before, on two ranks: tests/engine/checkpoint/test_sharded.py."""

from __future__ import annotations

import math
import os
import re
import signal
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.config import DataConfig
from {{cookiecutter.package_name}}.engine.assembly.components import build_model, build_task
from {{cookiecutter.package_name}}.engine.checkpoint.files import list_checkpoints, load_checkpoint
from {{cookiecutter.package_name}}.engine.data.loader import build_data
from {{cookiecutter.package_name}}.engine.evaluate import evaluate

from ..helpers import PYTHON, SMALL, cpu_env, run
from .jobs import (
    assert_bit_identical,
    checkpoint_of,
    finish,
    read_checkpoint,
    read_metrics,
    start,
    steps_saved,
    torchrun,
    wait_for,
    worker_pid,
)

pytestmark = pytest.mark.slow

# 2 processes x 16 images x 2 micro-batches a step (the reduce-scatter on the second only), 25 steps of
# small_cnn (95 k parameters, BatchNorm buffers); augmentation on, so the generator states matter.
FSDP = [*SMALL, "strategy=fsdp", "data.train_size=1600", "data.batch_size=16", "data.augment=true",
        "trainer.epochs=1", "trainer.grad_accum_steps=2", "trainer.log_every_n_steps=5", "checkpoint.every_n_steps=5",
        "checkpoint.keep_last=20"]  # fmt: skip
LAST = 25


def fingerprint(output: str) -> str:
    return re.findall(r"weights at step \d+: sha256 (\w+)", output)[-1]


def final_val(run_dir: Path) -> dict:
    return [record for record in read_metrics(run_dir) if record["kind"] == "val"][-1]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, str]:
    """The uninterrupted fsdp run, and its output."""
    run_dir = tmp_path_factory.mktemp("fsdp") / "reference"
    code, output = finish(start(run_dir, 2, *FSDP))
    assert code == 0, output[-3000:]
    return run_dir, output


def test_a_model_learns_under_fsdp_with_a_sharded_checkpoint_per_step(reference) -> None:
    run_dir, output = reference
    assert "blocks sharded" in output and "over 2 ranks, then the root" in output
    final, first = final_val(run_dir), read_metrics(run_dir)[0]
    # From about the uniform guess over 10 classes (ln 10 = 2.30 nats) to below it, in 25 steps.
    assert final["val_loss"] < math.log(10) - 0.2 < first["train_loss"] and final["val_acc"] > 0.15, (first, final)
    assert final["val_samples"] == 251
    assert steps_saved(run_dir) == [5, 10, 15, 20, 25]
    folder = checkpoint_of(run_dir, LAST)
    assert {p.name for p in folder.iterdir()} == {".metadata", "__0_0.distcp", "__1_0.distcp", "trainer.pt"}
    plain = torch.load(folder / "trainer.pt", weights_only=True)  # the position, generator states, config
    assert plain["step"] == LAST and plain["world_size"] == 2 and "model" not in plain
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".tmp_")]


def test_a_sigkill_during_a_sharded_save_resumes_from_the_one_before_bit_identical(reference, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start(run_dir, 2, *FSDP, "checkpoint.every_n_steps=1")  # a save at every step: one is always on
    folder = run_dir / "checkpoints"
    wait_for(
        lambda: 8 in steps_saved(run_dir) and any(p.name.startswith(".tmp_") for p in folder.iterdir()),
        "a sharded checkpoint being written",
    )
    os.kill(worker_pid(run_dir, 0), signal.SIGKILL)  # rank 0 commits: killed, nothing is committed
    for path in list_checkpoints(folder):  # never a partial checkpoint under a checkpoint's name
        read_checkpoint(path)
    code, output = finish(proc)
    assert code == 0 and re.search(r"resumed from \S+/step_000000\d\d\b", output), output[-3000:]
    assert not [p for p in folder.iterdir() if p.name.startswith(".tmp_")]
    assert steps_saved(run_dir) == list(range(LAST - 19, LAST + 1))  # checkpoint.keep_last=20 of them
    assert_bit_identical(reference[0], run_dir, step=LAST)
    assert fingerprint(output) == fingerprint(reference[1])  # the whole weights, gathered at the end


def test_the_export_equals_the_live_weights_and_evaluates_like_the_shards(reference, tmp_path: Path) -> None:
    run_dir, output = reference
    out = tmp_path / "weights.pt"
    exported = run([PYTHON, "-m", "{{cookiecutter.package_name}}.export", str(checkpoint_of(run_dir, LAST)), str(out)])
    assert f"weights at step {LAST}: sha256 {fingerprint(output)}" in exported.stdout
    # (An existing output refused, nothing overwritten: tests/test_export.py, in-process.)
    # The export in a plain model, as a user of the weights would load it, evaluated in this process...
    config = load_checkpoint(checkpoint_of(run_dir, LAST))["config"]
    model = build_model(config["model"])
    model.load_state_dict(torch.load(out, weights_only=True))
    data = build_data(DataConfig.from_node(config["data"]), cpu_env(0, 1), config["seed"])
    plain = evaluate(model, data.val_loader, build_task(config["task"]), torch.device("cpu")).line()
    # ...and the shards evaluated directly by eval.py on 2 processes: the same figures.
    sharded = torchrun("eval.py", 2, f"ckpt_path={checkpoint_of(run_dir, LAST)}").stdout.strip().splitlines()[-1]
    assert sharded == plain and math.isfinite(float(plain.split()[0].split("=")[1]))


def test_the_memory_benchmark_shows_fsdp_sharding_what_ddp_replicates() -> None:
    proc = run([PYTHON, "benchmarks/fsdp_memory.py", "--nprocs", "2", "--steps", "2", "--warmup", "1",
                "--model", "small_cnn", "--image-size", "16"], timeout=240)  # fmt: skip
    rows = {line.split()[1]: [float(x) for x in line.split()[2:6]] for line in proc.stdout.splitlines()
            if line.split()[:1] == ["2"]}  # fmt: skip
    assert set(rows) == {"ddp", "fsdp"}, proc.stdout
    for ddp, fsdp in zip(rows["ddp"], rows["fsdp"], strict=True):  # parameters, gradients, optimizer state, total
        assert fsdp == pytest.approx(ddp / 2, rel=0.05), proc.stdout  # halved, within a row of padding

"""Speed options of the training step on CPU: accumulation, precision, layout, clipping, compile, benchmark."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from torch import nn

from {{cookiecutter.package_name}}.config import TrainerConfig
from {{cookiecutter.package_name}}.launch import worker_environment
from {{cookiecutter.package_name}}.step import StepRunner, use_deterministic_kernels

from .conftest import SMALL, last_line, read_metrics, run, torchrun
from .test_checkpoint import assert_bit_identical, finish, start, steps_saved, wait_for, worker_pid


@pytest.mark.slow
def test_accumulated_micro_batches_give_the_big_batch_gradient_with_one_all_reduce() -> None:
    result = json.loads(last_line(torchrun("tests/accumulation_probe.py", 2, "4").stdout))
    assert result["difference"] <= 1e-5 * result["scale"], result
    one_batch, accumulated = result["calls"]
    assert accumulated == one_batch >= 1, "all-reduced once per optimizer step, not once per micro-batch"


# 2 epochs of 16 micro-batches on 2 processes, 3 per optimizer step: 6 steps an epoch (the last of 1).
# trainer.deterministic=true too: the GPU switch must not get in the way of training on CPUs.
ACCUMULATED = [*SMALL, "trainer.precision=bf16", "trainer.grad_accum_steps=3", "trainer.clip_grad_norm=1.0",
               "trainer.channels_last=true", "trainer.deterministic=true", "checkpoint.every_n_steps=2",
               "checkpoint.keep_last=20"]  # fmt: skip


@pytest.mark.parametrize(("preset", "expected"), [(None, "AUTO,STRICT"), ("COMPATIBLE", "COMPATIBLE")])
def test_launches_give_workers_alignment_independent_mkl_results(preset: str | None, expected: str) -> None:
    env = {key: value for key, value in os.environ.items() if key != "MKL_CBWR"}
    if preset:
        env["MKL_CBWR"] = preset  # the user's own choice wins
    assert worker_environment(env)["MKL_CBWR"] == expected


def test_deterministic_switch_sets_every_gpu_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    use_deterministic_kernels(False)
    assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    torch.backends.cudnn.benchmark = True
    try:
        use_deterministic_kernels(True)
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.backends.cudnn.benchmark is False
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.slow
def test_bf16_accumulation_counts_steps_and_resumes_bit_identical_after_sigkill(tmp_path: Path) -> None:
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    code, output = finish(start(reference, 2, *ACCUMULATED))
    assert code == 0, output[-3000:]
    records = read_metrics(reference)
    assert [r["step"] for r in records if r["kind"] == "val"] == [6, 12]
    losses = [r["train_loss"] for r in records if r["kind"] == "train"]
    assert losses[-1] < losses[0], losses
    proc = start(killed, 2, *ACCUMULATED)
    wait_for(lambda: 4 in steps_saved(killed), "the checkpoint of step 4")
    os.kill(worker_pid(killed, 1), signal.SIGKILL)
    code, output = finish(proc)
    assert code == 0 and "resumed from" in output, output[-3000:]
    assert_bit_identical(reference, killed, step=12)


@pytest.mark.slow
def test_compiled_model_trains_and_saves_plain_weights(tmp_path: Path) -> None:
    # torch.compile on CPU builds C++ kernels (about 40 s here): the smallest job that compiles.
    run(["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", f"RUN_DIR={tmp_path}", *SMALL, "trainer.compile=true",
         "trainer.epochs=1", "data.train_size=256", "data.val_size=64"])  # fmt: skip
    assert read_metrics(tmp_path)[-1]["kind"] == "val"
    saved = torch.load(tmp_path / "checkpoints" / "step_00000004.pt", weights_only=True)
    assert not any(key.startswith("_orig_mod.") for key in saved["model"]), "the checkpoint loads without compile"


def fp16_runner(clip: float) -> StepRunner:
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    config = TrainerConfig(
        epochs=1, log_every_n_steps=1, record_samples=False, precision="fp16", channels_last=False, compile=False,
        grad_accum_steps=1, clip_grad_norm=clip,
    )  # fmt: skip
    return StepRunner(model, torch.optim.SGD(model.parameters(), lr=1.0), config, torch.device("cpu"), 1)


def test_fp16_scales_the_loss_clips_unscaled_gradients_and_keeps_its_scale() -> None:
    runner = fp16_runner(clip=1e-3)
    before = [p.detach().clone() for p in runner.ddp_model.parameters()]
    loss = runner.micro_step(torch.randn(4, 8), torch.tensor([0, 1, 2, 0]), torch.ones(4), 4, sync=True)
    runner.optimizer_step()
    after = list(runner.ddp_model.parameters())
    moved = torch.stack([(a.detach() - b).norm() for a, b in zip(after, before, strict=True)]).norm()
    # SGD with lr 1 moves the weights by the clipped gradient: norm 1e-3 once unscaled (not 1e-3 / 65536).
    assert loss > 0 and moved == pytest.approx(1e-3, rel=0.05)
    state = runner.state_dict()
    assert state["scale"] == 65536.0  # the loss scale, saved in checkpoints as "grad_scaler"
    resumed = fp16_runner(clip=1e-3)
    resumed.load_state_dict({**state, "scale": 1024.0})
    assert resumed.state_dict()["scale"] == 1024.0


@pytest.mark.slow
def test_benchmark_smoke_mode_compares_the_loops(tmp_path: Path) -> None:
    proc = torchrun("benchmarks/bench.py", 2, "--smoke", "--precision=bf16", "--channels-last")
    lines = proc.stdout.splitlines()
    rates = {line.split()[0]: float(line.split()[1]) for line in lines if "images/s" in line}
    assert {"project", "bare"} <= set(rates) and all(rate > 0 for rate in rates.values()), proc.stdout
    assert any(line.startswith("ratio project/bare ") for line in lines), proc.stdout
    assert "precision bf16" in lines[0] and "checkpoint save holds training" in lines[-1], proc.stdout

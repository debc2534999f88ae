"""step.py in this process: the fp16 loss scale and clipping, the deterministic switch, what a sample's
weight does to the loss (padding, weight 0, adds nothing)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from {{cookiecutter.package_name}}.config import TrainerConfig
from {{cookiecutter.package_name}}.engine.step import StepRunner, use_deterministic_kernels


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


def linear_runner(clip: float, precision: str = "fp16") -> StepRunner:
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    config = TrainerConfig(
        epochs=1, log_every_n_steps=1, record_samples=False, precision=precision, channels_last=False, compile=False,
        grad_accum_steps=1, clip_grad_norm=clip,
    )  # fmt: skip
    return StepRunner(model, torch.optim.SGD(model.parameters(), lr=1.0), config, torch.device("cpu"), 1)


def test_fp16_scales_the_loss_clips_unscaled_gradients_and_keeps_its_scale() -> None:
    runner = linear_runner(clip=1e-3)
    before = [p.detach().clone() for p in runner.trained.parameters()]
    loss = runner.micro_step(torch.randn(4, 8), torch.tensor([0, 1, 2, 0]), torch.ones(4), 4, sync=True)
    runner.optimizer_step()
    after = list(runner.trained.parameters())
    moved = torch.stack([(a.detach() - b).norm() for a, b in zip(after, before, strict=True)]).norm()
    # SGD with lr 1 moves the weights by the clipped gradient: norm 1e-3 once unscaled (not 1e-3 / 65536).
    assert loss > 0 and moved == pytest.approx(1e-3, rel=0.05)
    state = runner.state_dict()["grad_scaler"]  # the runner's part of a checkpoint
    assert state["scale"] == 65536.0
    resumed = linear_runner(clip=1e-3)
    resumed.load_state_dict({"grad_scaler": {**state, "scale": 1024.0}})
    assert resumed.state_dict()["grad_scaler"]["scale"] == 1024.0


def test_an_fp16_run_resumed_from_a_checkpoint_without_a_scaler_keeps_its_own() -> None:
    resumed = linear_runner(clip=0.0)
    resumed.load_state_dict({"grad_scaler": {}})  # the checkpoint of an fp32 or bf16 run
    assert resumed.state_dict()["grad_scaler"]["scale"] == 65536.0


def test_clip_grad_norm_0_leaves_the_gradient_unclipped() -> None:
    runner = linear_runner(clip=0.0)
    before = [p.detach().clone() for p in runner.trained.parameters()]
    runner.micro_step(torch.randn(4, 8), torch.tensor([0, 1, 2, 0]), torch.ones(4), 4, sync=True)
    runner.optimizer_step()
    moved = torch.stack([(a.detach() - b).norm() for a, b in zip(runner.trained.parameters(), before, strict=True)])
    assert moved.norm() > 1e-2, "trainer.clip_grad_norm=0 is off, not a clip to norm 0"


def test_padding_of_weight_0_adds_nothing_to_the_loss_or_the_gradient() -> None:
    runner = linear_runner(clip=0.0, precision="fp32")
    model = runner.trained
    inputs, targets = torch.randn(4, 8), torch.tensor([0, 1, 2, 0])
    loss = runner.micro_step(inputs, targets, torch.tensor([1.0, 1.0, 0.0, 0.0]), real_samples=2, sync=True)
    padded = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = nn.functional.cross_entropy(model(inputs[:2]), targets[:2])  # the 2 real samples' mean
    expected.backward()
    assert torch.allclose(loss, expected.detach())
    assert all(torch.allclose(a, p.grad) for a, p in zip(padded, model.parameters(), strict=True))

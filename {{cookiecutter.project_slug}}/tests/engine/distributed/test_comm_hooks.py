"""comm_hooks.py on two real gloo ranks: compressed gradients averaged within their dtype's rounding,
the configured hook registered, PowerSGD's memory carried through a checkpoint."""

from __future__ import annotations

import copy
import io
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.config import DDPConfig, to_train_config
from {{cookiecutter.package_name}}.engine.distributed.comm_hooks import (
    PowerSGDHook,
    hook_state_dict,
    load_hook_state,
    register_comm_hook,
)

from ...helpers import compose_config, cpu_env, on_ranks, train_stop_resume


def ddp_config(*overrides: str) -> DDPConfig:
    return to_train_config(compose_config(list(overrides))).ddp


def batch(step: int, rank: int) -> torch.Tensor:
    return torch.randn(8, 64, generator=torch.Generator().manual_seed(1000 * step + rank))


def local_gradient(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    plain = copy.deepcopy(model)
    plain(inputs).pow(2).sum().backward()
    return plain.weight.grad


def gradient_under_hook(env: DistEnv, config: DDPConfig) -> dict:
    torch.manual_seed(0)
    model = nn.Linear(64, 32, bias=False)
    mine = [local_gradient(model, batch(0, rank)) for rank in range(env.world_size)]  # each rank's own, in fp32
    ddp = DistributedDataParallel(model)
    returned = register_comm_hook(ddp, config, env)
    ddp(batch(0, env.rank)).pow(2).sum().backward()
    return {"averaged": model.weight.grad.clone(), "local": mine, "returned": returned,
            "hook": ddp._get_ddp_logging_data().get("comm_hook", "")}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("hook", "dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_a_compressed_gradient_is_the_average_rounded_to_its_dtype(hook: str, dtype: torch.dtype) -> None:
    ranks = on_ranks(2, gradient_under_hook, ddp_config(f"ddp.comm_hook={hook}"))
    g0, g1 = ranks[0]["local"]
    exact = (g0 + g1) / 2
    # What the hook does: each rank's gradient in 16 bits, halved, summed over the ranks in 16 bits.
    compressed = ((g0.to(dtype) / 2) + (g1.to(dtype) / 2)).float()
    # Two roundings of each addend's size at most (to 16 bits, then the sum), and fp16's smallest step.
    rounding = 2 * torch.finfo(dtype).eps / 2 * (g0.abs() + g1.abs()) / 2 + 2**-24
    for rank, result in enumerate(ranks):
        assert result["returned"] is None, "no state to checkpoint"
        assert result["hook"] == f"{hook}_compress_hook", "the configured hook is the registered one"
        assert torch.equal(result["averaged"], compressed), f"rank {rank}: the average in {dtype}"
        assert bool(((result["averaged"] - exact).abs() <= rounding).all()), "within the dtype's rounding"
    assert not torch.equal(ranks[0]["averaged"], exact), "compressed: not the fp32 average"


def test_without_a_hook_the_gradient_is_the_exact_fp32_average() -> None:
    ranks = on_ranks(2, gradient_under_hook, ddp_config("ddp.comm_hook=none"))
    g0, g1 = ranks[0]["local"]
    for result in ranks:
        assert result["returned"] is None and result["hook"] in ("", "builtin_allreduce")
        assert torch.equal(result["averaged"], (g0 + g1) / 2)


def test_a_model_without_ddp_gets_no_hook() -> None:
    model = nn.Linear(2, 2)
    assert register_comm_hook(model, ddp_config("ddp.comm_hook=powersgd"), cpu_env(0, 1)) is None
    assert hook_state_dict(None) is None
    load_hook_state(None, {"iter": 3})  # the fp16/bf16/none hooks have no memory: nothing to load


def powersgd_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16))


def train_step(ddp: DistributedDataParallel, optimizer: torch.optim.Optimizer, step: int, rank: int) -> list:
    optimizer.zero_grad()
    ddp(batch(step, rank)).pow(2).mean().backward()
    grads = [param.grad.clone() for param in ddp.module.parameters()]
    optimizer.step()
    return grads


def powersgd_through_a_checkpoint(env: DistEnv, config: DDPConfig) -> dict:
    """Train 4 steps; save the hook's state; a new DDP model with the same weights and that state
    (as a resumed run builds) and one without it take the next steps beside the original."""
    original = DistributedDataParallel(powersgd_model())
    hook = register_comm_hook(original, config, env)
    optimizer = torch.optim.SGD(original.parameters(), lr=0.05)
    for step in range(4):
        train_step(original, optimizer, step, env.rank)
    saved = hook_state_dict(hook)  # a collective: rank 0 gets it, as it writes the checkpoint
    shared = [None]
    if env.is_main:
        file = io.BytesIO()
        torch.save(saved, file)  # the checkpoint file: its tensors copied, not the hook's memory
        shared = [file.getvalue()]
    dist.broadcast_object_list(shared, src=0)  # every rank reads the checkpoint
    saved = torch.load(io.BytesIO(shared[0]), weights_only=True)

    def rebuilt(restore: bool) -> tuple[DistributedDataParallel, PowerSGDHook, torch.optim.Optimizer]:
        module = powersgd_model()
        module.load_state_dict(original.module.state_dict())
        ddp = DistributedDataParallel(module)
        new_hook = register_comm_hook(ddp, config, env)
        if restore:
            load_hook_state(new_hook, saved)
        return ddp, new_hook, torch.optim.SGD(ddp.parameters(), lr=0.05)

    resumed, resumed_hook, resumed_optimizer = rebuilt(restore=True)
    round_trip = hook_state_dict(resumed_hook)
    forgetful, _, forgetful_optimizer = rebuilt(restore=False)
    steps = {"original": [], "resumed": [], "forgetful": []}
    for step in range(4, 7):
        steps["original"].append(train_step(original, optimizer, step, env.rank))
        steps["resumed"].append(train_step(resumed, resumed_optimizer, step, env.rank))
        steps["forgetful"].append(train_step(forgetful, forgetful_optimizer, step, env.rank))
    return {"saved": saved, "round_trip": round_trip, "steps": steps, "hook": type(hook).__name__,
            "state": (hook.state.matrix_approximation_rank, hook.state.start_powerSGD_iter)}  # fmt: skip


def assert_same(a: object, b: object, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{index}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.slow
def test_powersgd_state_round_trips_and_a_resumed_model_steps_as_the_uninterrupted_one() -> None:
    config = ddp_config("ddp.comm_hook=powersgd", "ddp.powersgd_rank=2", "ddp.powersgd_start_iter=2")
    ranks = on_ranks(2, powersgd_through_a_checkpoint, config)
    saved = ranks[0]["saved"]
    assert ranks[0]["state"] == (2, 2), "the configured rank and start"
    assert ranks[0]["hook"] == PowerSGDHook.__name__, "the hook whose memory is checkpointed"
    assert saved["iter"] == 4 and len(saved["error_per_rank"]) == 2
    weights = ["0.weight", "2.weight"]  # compressed; the biases too are kept in the error feedback
    assert sorted(saved["q_memory"]) == weights and sorted(saved["error_per_rank"][1]) == sorted(
        ["0.weight", "0.bias", "2.weight", "2.bias"]
    )
    assert not torch.equal(saved["error_per_rank"][0]["0.weight"], saved["error_per_rank"][1]["0.weight"])
    assert ranks[1]["round_trip"] is None, "gathered on rank 0 only"
    assert_same(ranks[0]["round_trip"], saved, "state_dict after load_state_dict")
    for rank, result in enumerate(ranks):
        for step, (original, resumed) in enumerate(zip(result["steps"]["original"], result["steps"]["resumed"],
                                                       strict=True)):  # fmt: skip
            assert_same(resumed, original, f"rank {rank} step {4 + step} gradients")
    forgetful = ranks[0]["steps"]["forgetful"][0]
    assert not torch.equal(forgetful[0], ranks[0]["steps"]["original"][0][0]), "the memory is what makes them equal"


@pytest.mark.slow  # a trainer's two epochs on two ranks, 6-11 s: in place of the end-to-end kill of a PowerSGD job
def test_a_powersgd_run_resumed_from_its_checkpoint_ends_as_the_uninterrupted_one(tmp_path: Path) -> None:
    """The trainer saves PowerSGD's memory in each checkpoint and a restarted job loads it: steps 5 and 6
    after a resume from step 4 are the uninterrupted run's, bit for bit (compressing since step 2). A real
    PowerSGD job: tests/e2e/test_comm_hooks.py; a real kill and torchrun's restart: tests/e2e/test_resume.py."""
    job = ["strategy=ddp", "model=small_cnn", "ddp.comm_hook=powersgd", "ddp.powersgd_start_iter=2"]
    ends = on_ranks(2, train_stop_resume, tmp_path, job)[0]
    assert ends["uninterrupted_step"] == ends["resumed_step"] == 6
    assert_same(ends["resumed"], ends["uninterrupted"], "the resumed run's weights")
    saved = torch.load(tmp_path / "checkpoints" / "step_00000004.pt", weights_only=True)["comm_hook"]
    assert saved["iter"] > 2 and len(saved["error_per_rank"]) == 2
    assert any(tensor.abs().sum() > 0 for tensor in saved["error_per_rank"][1].values()), "rank 1's memory too"

"""Run by tests/e2e/test_step.py under torchrun: one optimizer step of accumulated micro-batches
against one step of the whole batch, through the project's StepRunner and its DDP wrapping (or,
with `fsdp` after the micro-batch count, its FSDP sharding).

Prints one JSON line (rank 0): the largest gradient difference and the gradient reductions each
made (DDP's bucket all-reduces, FSDP's reduce-scatters).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from {{cookiecutter.package_name}}.config import DDPConfig, DistConfig, FSDPConfig, TrainerConfig  # noqa: E402
from {{cookiecutter.package_name}}.engine.distributed.process_group import distributed  # noqa: E402
from {{cookiecutter.package_name}}.engine.strategies import strategy_class  # noqa: E402
from {{cookiecutter.package_name}}.engine.trainer import StepRunner  # noqa: E402
from {{cookiecutter.package_name}}.tasks import Classification  # noqa: E402

DDP = DDPConfig(
    bucket_cap_mb=25, gradient_as_bucket_view=True, static_graph=False, find_unused_parameters=False,
    broadcast_buffers=True, sync_batchnorm=False, comm_hook="none", powersgd_rank=1, powersgd_start_iter=2,
)  # fmt: skip


@contextlib.contextmanager
def counting_reduce_scatters(calls: list) -> Iterator[None]:
    """Count FSDP's gradient reduce-scatters (it looks torch.distributed's up at each call)."""
    original = torch.distributed.reduce_scatter_single

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    torch.distributed.reduce_scatter_single = counting
    try:
        yield
    finally:
        torch.distributed.reduce_scatter_single = original


def one_step(accum: int, images: torch.Tensor, labels: torch.Tensor, env, strategy: str):
    """Gradients after the step's backwards (before the optimizer), and how many reductions ran."""
    torch.manual_seed(0)  # the same initial weights for both
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.ReLU(), nn.Linear(16, 4))
    calls: list = []
    counting: contextlib.AbstractContextManager = contextlib.nullcontext()
    config = TrainerConfig(
        epochs=1, log_every_n_steps=1, record_samples=False, precision="fp32", channels_last=False,
        compile=False, grad_accum_steps=accum, clip_grad_norm=0.0,
    )  # fmt: skip
    fsdp = FSDPConfig(blocks=["Linear"], reshard_after_forward=True, cpu_offload=False)
    spread = strategy_class(strategy)(SimpleNamespace(ddp=DDP, fsdp=fsdp, trainer=config), env)  # the project's own
    model = spread.prepare(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trained = spread.wrap(model, optimizer)
    if strategy == "fsdp":
        counting = counting_reduce_scatters(calls)
    else:

        def counting_allreduce(state, bucket):
            calls.append(bucket.index())
            return default_hooks.allreduce_hook(state, bucket)

        trained.register_comm_hook(None, counting_allreduce)
    runner = StepRunner(trained, optimizer, config, env.device, env.world_size, Classification(), spread)
    weights = torch.ones(len(labels))
    real_samples = len(labels) * env.world_size
    micro_batches = zip(images.chunk(accum), labels.chunk(accum), weights.chunk(accum), strict=True)
    with counting:
        for i, (x, y, w) in enumerate(micro_batches):
            runner.micro_step(x, y, w, real_samples, sync=i == accum - 1)
    grads = [p.grad.full_tensor() if strategy == "fsdp" else p.grad.clone() for p in model.parameters()]
    return grads, len(calls)


def main() -> int:
    accum, strategy = int(sys.argv[1]), (sys.argv[2:] or ["ddp"])[0]
    with distributed(DistConfig(backend="gloo", timeout_s=120)) as env:
        generator = torch.Generator().manual_seed(100 + env.rank)  # each rank its own batch
        images, labels = torch.randn(32, 3, 8, 8, generator=generator), torch.randint(0, 4, (32,), generator=generator)
        big, big_calls = one_step(1, images, labels, env, strategy)
        small, small_calls = one_step(accum, images, labels, env, strategy)
        difference = max((a - b).abs().max().item() for a, b in zip(big, small, strict=True))
        scale = max(a.abs().max().item() for a in big)
        if env.is_main:
            print(json.dumps({"difference": difference, "scale": scale, "calls": [big_calls, small_calls]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

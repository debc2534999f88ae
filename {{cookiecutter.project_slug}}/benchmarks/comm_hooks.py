"""One row per gradient-compression hook: images/s and bytes all-reduced per step, side by side.

    torchrun --standalone --nproc-per-node=2 benchmarks/comm_hooks.py [--model small_cnn] [--steps 30]

Every hook trains the same model on the same fixed batch in this one run, with the project's
own DDP wrapping and hook registration, so the rows compare with each other (not across runs).
Bytes are what each rank hands to all-reduce per optimizer step, as measured: the tensors a hook
hands to torch.distributed.all_reduce, or, without a hook, the gradient buckets DDP all-reduces
itself; beside them their dtype and the hook DDP reports as registered.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from {{cookiecutter.package_name}}.common.processes import exit_now  # noqa: E402
from {{cookiecutter.package_name}}.config import COMM_HOOKS, DDPConfig, DistConfig  # noqa: E402
from {{cookiecutter.package_name}}.engine.assembly.components import build_model  # noqa: E402
from {{cookiecutter.package_name}}.engine.distributed.comm_hooks import register_comm_hook  # noqa: E402
from {{cookiecutter.package_name}}.engine.distributed.process_group import distributed  # noqa: E402
from {{cookiecutter.package_name}}.engine.strategies.ddp import wrap_ddp  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# train.yaml's DDP settings, with PowerSGD's plain steps cut short so that the warm-up passes them.
BASE = DDPConfig(**{**OmegaConf.to_container(OmegaConf.load(CONFIGS / "train.yaml").ddp), "powersgd_start_iter": 2})


@contextlib.contextmanager
def counting_all_reduces(sent: list[torch.Tensor]) -> Iterator[None]:
    """Record every tensor the hooks hand to torch.distributed.all_reduce (they look it up at each call)."""
    original = torch.distributed.all_reduce

    def counting(tensor: torch.Tensor, *args, **kwargs):
        sent.append(tensor)
        return original(tensor, *args, **kwargs)

    torch.distributed.all_reduce = counting
    try:
        yield
    finally:
        torch.distributed.all_reduce = original


def what_was_sent(ddp_model: DistributedDataParallel, sent: list[torch.Tensor], steps: int) -> tuple[float, str]:
    """Bytes all-reduced per step and their dtypes: what a hook handed to all_reduce, or, without a hook,
    the gradient buckets DDP's reducer all-reduces itself (its own record of their sizes, in bytes)."""
    if sent:
        nbytes = sum(tensor.numel() * tensor.element_size() for tensor in sent)
        return nbytes / steps, ",".join(sorted({str(tensor.dtype).removeprefix("torch.") for tensor in sent}))
    buckets = ddp_model._get_ddp_logging_data()["rebuilt_bucket_sizes"]
    return float(sum(int(size) for size in str(buckets).split())), "float32"


def measure(hook_name: str, args: argparse.Namespace, env) -> tuple[float, float, str, str]:
    """images/s, bytes all-reduced per step, their dtypes, and the hook DDP says it has."""
    torch.manual_seed(0)
    config = OmegaConf.to_container(OmegaConf.load(CONFIGS / "model" / f"{args.model}.yaml"))
    model = build_model({**config, "num_classes": 10}).to(env.device)  # type: ignore[dict-item]
    ddp_model = wrap_ddp(model, replace(BASE, comm_hook=hook_name), env)
    register_comm_hook(ddp_model, replace(BASE, comm_hook=hook_name), env)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(args.batch, 3, 32, 32, device=env.device)
    labels = torch.randint(0, 10, (args.batch,), device=env.device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(ddp_model(images), labels).backward()
        optimizer.step()

    for _ in range(args.warmup):  # also past PowerSGD's plain steps
        step()
    torch.distributed.barrier()
    sent: list[torch.Tensor] = []
    started = time.perf_counter()
    with counting_all_reduces(sent):
        for _ in range(args.steps):
            step()
    if env.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    images_per_s = args.steps * args.batch * env.world_size / elapsed
    registered = str(ddp_model._get_ddp_logging_data().get("comm_hook") or "-")
    return images_per_s, *what_was_sent(ddp_model, sent, args.steps), registered


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    models = sorted(path.stem for path in (CONFIGS / "model").glob("*.yaml")
                    if "num_classes: ${data.num_classes}" in path.read_text())  # fmt: skip  # the image classifiers
    parser.add_argument("--model", default="small_cnn", choices=models, help="an image model of configs/model/")
    parser.add_argument("--batch", type=int, default=32, help="per process")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    with distributed(DistConfig(backend="auto", timeout_s=600)) as env:
        if env.world_size < 2:
            print("error: run under torchrun with at least 2 processes: hooks act on DDP's all-reduce", file=sys.stderr)
            return 2
        rows = [(name, *measure(name, args, env)) for name in COMM_HOOKS]
        # Free the four DDP models (reference cycles) while the process group still exists:
        # a reducer destroyed after it can abort the process at exit.
        gc.collect()
        torch.distributed.barrier()
        if env.is_main:
            print(f"model {args.model}, {env.world_size} processes, batch {args.batch}/process, {env.backend}")
            print(f"{'comm_hook':<10} {'images/s':>10} {'bytes all-reduced/step':>24} {'vs none':>8} "
                  f"{'dtype':<16} registered hook")  # fmt: skip
            for name, images_per_s, sent, dtypes, registered in rows:
                print(f"{name:<10} {images_per_s:>10.0f} {sent:>24.0f} {sent / rows[0][2]:>8.3f} {dtypes:<16} "
                      f"{registered}")  # fmt: skip
    return 0


if __name__ == "__main__":
    exit_now(main())  # as train.py: no interpreter teardown (gloo's threads aborted it: "terminate called")

"""Memory per rank and speed of strategy=ddp against strategy=fsdp, for an image classifier.

    python benchmarks/fsdp_memory.py [--nprocs 1,2,4] [--steps 20] [--model resnet18] [--image-size 32]

For each process count it starts one torchrun job (on the GPUs if there are enough, else CPU
processes), which trains the model of configs/model/<--model>.yaml (10 classes) with AdamW under both
strategies in turn, with the project's own DDP wrapping and FSDP sharding, and reports per rank the bytes of
parameters, gradients and optimizer state after an optimizer step (fsdp's should fall as 1/N,
ddp's stay whole) and optimizer steps per second. The rows of one job compare with each other.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from {{cookiecutter.package_name}}.common.processes import exit_now  # noqa: E402
from {{cookiecutter.package_name}}.config import DDPConfig, DistConfig  # noqa: E402
from {{cookiecutter.package_name}}.config.sharding import FSDPConfig  # noqa: E402
from {{cookiecutter.package_name}}.engine.assembly.components import build_model  # noqa: E402
from {{cookiecutter.package_name}}.engine.distributed.process_group import distributed  # noqa: E402
from {{cookiecutter.package_name}}.engine.strategies import strategy_class  # noqa: E402
from {{cookiecutter.package_name}}.engine.strategies.fsdp import per_rank_bytes  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TRAIN = OmegaConf.load(CONFIGS / "train.yaml")
DDP = DDPConfig(**OmegaConf.to_container(TRAIN.ddp))  # type: ignore[arg-type]
FSDP = FSDPConfig(**OmegaConf.to_container(TRAIN.fsdp))  # type: ignore[arg-type]
MIB = 2**20


def image_classifiers() -> list[str]:
    """The model configs that take data.num_classes: the image classifiers."""
    return sorted(path.stem for path in (CONFIGS / "model").glob("*.yaml")
                  if "num_classes: ${data.num_classes}" in path.read_text())  # fmt: skip


def model_node(name: str) -> dict:
    """configs/model/<name>.yaml for 10 classes, its other interpolations resolved as train.yaml would."""
    node = OmegaConf.load(CONFIGS / "model" / f"{name}.yaml")
    assert isinstance(node, DictConfig)
    node.num_classes = 10
    return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]


def measure(strategy: str, args: argparse.Namespace, env) -> dict:
    torch.manual_seed(0)
    node = model_node(args.model)
    config = SimpleNamespace(ddp=DDP, fsdp=FSDP, trainer=SimpleNamespace(precision="fp32"))
    spread = strategy_class(strategy)(config, env)
    model = spread.prepare(build_model(node).to(env.device))  # the project's own ddp and fsdp
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trained = spread.wrap(model, optimizer)
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, device=env.device)
    labels = torch.randint(0, 10, (args.batch,), device=env.device)

    def step() -> None:
        F.cross_entropy(trained(images), labels).backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
        optimizer.zero_grad(set_to_none=True)
    step()
    held = per_rank_bytes(model, optimizer)  # gradients and optimizer state are all there now
    optimizer.zero_grad(set_to_none=True)
    torch.distributed.barrier()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
        optimizer.zero_grad(set_to_none=True)
    torch.distributed.barrier()
    steps_per_s = args.steps / (time.perf_counter() - started)
    return {"strategy": strategy, "nproc": env.world_size, **held, "steps_per_s": steps_per_s}


def worker(args: argparse.Namespace) -> None:
    with distributed(DistConfig(backend="auto", timeout_s=600), group_of_one=True) as env:
        rows = []
        for strategy in ("ddp", "fsdp"):
            rows.append(measure(strategy, args, env))
            gc.collect()  # the model's last references: DDP's reducer must go while the process group exists
        if env.is_main:
            for row in rows:
                print("ROW " + json.dumps(row), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", default="1,2,4", help="process counts, one job each")
    parser.add_argument("--model", default="resnet18", choices=image_classifiers(), help="an image classifier")
    parser.add_argument("--batch", type=int, default=8, help="images per process per step")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    rows = []
    for nproc in (int(n) for n in args.nprocs.split(",")):
        passed = [f"--{key.replace('_', '-')}={value}" for key, value in vars(args).items()
                  if key not in ("nprocs", "worker")]  # fmt: skip
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               __file__, "--worker", *passed]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
        rows += [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]
    print(f"{args.model}, AdamW, {args.batch} images of {args.image_size}x{args.image_size} a process")
    print(f"{'procs':>5} {'strategy':<8} {'params MiB':>10} {'grads MiB':>10} {'optim MiB':>10} {'total MiB':>10} "
          f"{'steps/s':>8} {'vs ddp':>7}")  # fmt: skip
    for row in rows:
        total = row["parameters"] + row["gradients"] + row["optimizer"]
        ddp = next(r for r in rows if r["nproc"] == row["nproc"] and r["strategy"] == "ddp")
        mib = [row[key] / MIB for key in ("parameters", "gradients", "optimizer")] + [total / MIB]
        print(f"{row['nproc']:>5} {row['strategy']:<8} " + " ".join(f"{value:>10.3f}" for value in mib)
              + f" {row['steps_per_s']:>8.2f} {row['steps_per_s'] / ddp['steps_per_s']:>7.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    exit_now(main())  # as train.py: no interpreter teardown (gloo's threads aborted it: "terminate called")

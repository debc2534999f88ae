"""Training speed of the project's own loop against a bare DDP loop (and Lightning), side by side.

    torchrun --standalone --nproc-per-node=<N> benchmarks/bench.py [--model resnet18] [--batch 256]
        [--precision bf16] [--channels-last] [--compile] [--on-device] [--steps 50] [--rounds 3] [--workers 8]
    torchrun --standalone --nproc-per-node=2 benchmarks/bench.py --smoke     # seconds, on CPU: the tests

In one run, alternating round by round on the same model, batch and synthetic data:
- project: the trainer's own epoch loop (train_epoch) with its real data path (sampler, DataLoader
  workers, pinned memory, host-to-device copies), its logging and its SIGTERM check;
- bare: a minimal DDP loop on one fixed batch already on the device (no data path at all);
- lightning: PyTorch Lightning's Trainer on the same model and data, when it is installed (its own
  fit after the others, a warm-up epoch then one epoch per round).
Each figure is the median over rounds of steady-state images/s (after a warm-up round); the
ratios are what to read. Last, how long a checkpoint save holds training up (the snapshot to
host memory; the write to disk runs in the background).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

PROJECT_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_DIR))

from {{cookiecutter.package_name}}.common.processes import exit_now  # noqa: E402
from {{cookiecutter.package_name}}.common.run_dir import register_resolvers  # noqa: E402
from {{cookiecutter.package_name}}.config import PRECISIONS, DistConfig, register_configs, to_train_config  # noqa: E402
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer  # noqa: E402
from {{cookiecutter.package_name}}.engine.assembly.components import build_model  # noqa: E402
from {{cookiecutter.package_name}}.engine.distributed.process_group import distributed  # noqa: E402
from {{cookiecutter.package_name}}.engine.preemption import StopOnSigterm  # noqa: E402
from {{cookiecutter.package_name}}.engine.strategies.ddp import wrap_ddp  # noqa: E402
from {{cookiecutter.package_name}}.engine.trainer import AUTOCAST_DTYPES  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    models = sorted(path.stem for path in (PROJECT_DIR / "configs" / "model").glob("*.yaml")
                    if "num_classes: ${data.num_classes}" in path.read_text())  # fmt: skip  # the image classifiers
    parser.add_argument("--model", default="small_cnn", choices=models, help="an image model of configs/model/")
    parser.add_argument("--batch", type=int, default=32, help="per process")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS)
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--on-device", action="store_true", help="the project's data.on_device=true (no workers)")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds of each loop, alternating")
    parser.add_argument("--workers", type=int, help="DataLoader workers per process (default: configs/data/)")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--smoke", action="store_true", help="tiny and quick: checks that every part runs")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.rounds, args.workers = 3, 1, 0
    return args


def compose(args: argparse.Namespace, world_size: int, run_dir: Path):
    """The project's config, as train.py composes it, for this benchmark."""
    from hydra import compose, initialize_config_dir

    register_configs()
    register_resolvers()
    overrides = [
        "task=classification", f"model={args.model}", "data=synthetic", f"data.batch_size={args.batch}",
        f"data.train_size={args.batch * world_size * args.steps}", f"data.val_size={world_size}",
        f"data.image_size={args.image_size}", f"data.on_device={args.on_device}",
        f"trainer.precision={args.precision}", f"trainer.channels_last={args.channels_last}",
        f"trainer.compile={args.compile}", "trainer.epochs=1000000", "trainer.log_every_n_steps=1000000",
        "checkpoint.every_n_steps=0", "checkpoint.keep_last=2",
    ]  # fmt: skip
    if args.workers is not None:
        overrides.append(f"data.num_workers={args.workers}")
    with initialize_config_dir(config_dir=str(PROJECT_DIR / "configs"), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=overrides))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    torch.distributed.barrier()


def timed(run: Callable[[], int], device: torch.device) -> tuple[float, int]:
    """images/s of one call of `run`, and the images it trained on (all ranks), as `run` returns them."""
    synchronize(device)
    started = time.perf_counter()
    images = run()
    synchronize(device)
    return images / (time.perf_counter() - started), images


def project_round(trainer, stop: StopOnSigterm) -> Callable[[], int]:
    def run() -> int:
        trainer.train_epoch(stop)  # one epoch is `steps` optimizer steps: the data set was sized so
        trainer.end_epoch()
        return trainer.data.sampler.dataset_size

    return run


def bare_round(config, env, args: argparse.Namespace) -> Callable[[], int]:
    """A minimal DDP loop: one fixed batch on the device, the same model, precision and layout."""
    torch.manual_seed(config.seed)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = build_model(config.model).to(env.device, memory_format=memory_format)
    ddp_model = wrap_ddp(torch.compile(model) if args.compile else model, config.ddp, env)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    size = args.image_size
    images = torch.randn(args.batch, 3, size, size, device=env.device).contiguous(memory_format=memory_format)
    labels = torch.randint(0, config.data.num_classes, (args.batch,), device=env.device)
    dtype = AUTOCAST_DTYPES[args.precision]
    scaler = torch.amp.GradScaler(env.device.type, enabled=args.precision == "fp16")

    def run() -> int:
        for _ in range(args.steps):
            with torch.autocast(env.device.type, dtype=dtype) if dtype else contextlib.nullcontext():
                loss = F.cross_entropy(ddp_model(images).float(), labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return args.steps * args.batch * env.world_size

    return run


def import_lightning():
    """Lightning's package (either of its names), or None."""
    for name in ("lightning", "pytorch_lightning"):
        with contextlib.suppress(ImportError):
            return __import__(name)
    return None


def lightning_rates(config, env, args: argparse.Namespace) -> list[float] | str:
    """images/s of Lightning's Trainer per epoch on the same model and data (one fit: a warm-up
    epoch, then `rounds` timed ones), or why it was not run."""
    L = import_lightning()  # noqa: N806
    if L is None:
        return "not installed (pip install lightning to compare)"
    if env.device.type == "cuda" and env.local_world_size > torch.cuda.device_count():
        return "skipped: its Trainer takes one GPU per process, and these processes share GPUs"
    from torch.utils.data import DataLoader, TensorDataset

    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    size, count = args.image_size, args.batch * env.world_size * args.steps
    workers = config.data.num_workers
    torch.manual_seed(config.seed)
    dataset = TensorDataset(torch.randn(count, 3, size, size), torch.randint(0, config.data.num_classes, (count,)))
    rates: list[float] = []

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = build_model(config.model).to(memory_format=memory_format)
            self.started = 0.0

        def training_step(self, batch, _index):
            images, labels = batch
            return F.cross_entropy(self.model(images.contiguous(memory_format=memory_format)), labels)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

        def train_dataloader(self):
            return DataLoader(
                dataset, batch_size=args.batch, shuffle=True, num_workers=workers, drop_last=True,
                pin_memory=env.device.type == "cuda", persistent_workers=workers > 0,
            )  # fmt: skip

        def on_train_epoch_start(self) -> None:
            synchronize(env.device)
            self.started = time.perf_counter()

        def on_train_epoch_end(self) -> None:
            synchronize(env.device)
            rates.append(count / (time.perf_counter() - self.started))

    precision = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}[args.precision]
    trainer = L.Trainer(
        accelerator=env.device.type, devices=env.local_world_size, num_nodes=env.world_size // env.local_world_size,
        strategy="ddp", precision=precision, max_epochs=1 + args.rounds, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    module = Module()
    trainer.fit(torch.compile(module) if args.compile else module)
    return rates[1:]  # the first epoch is the warm-up


def checkpoint_hold_ms(trainer) -> float:
    """How long a save of the current step held training up (the previous write finished first)."""
    trainer.checkpoints.wait()
    synchronize(trainer.env.device)
    held = trainer.save()
    trainer.checkpoints.wait()  # the background write must not overlap the next timed round
    return held if held is not None else float("nan")


def measure(args: argparse.Namespace, env, run_dir: Path) -> tuple[dict[str, list[float]], float, str, str]:
    """images/s of each loop per round, the longest save hold, why Lightning did not run, and the work
    each loop did (images per round; the optimizer steps the project's trainer counted)."""
    config = compose(args, env.world_size, run_dir)
    trainer = build_trainer(config, env, run_dir)
    stop = StopOnSigterm()
    loops = {"project": project_round(trainer, stop), "bare": bare_round(config, env, args)}
    for run in loops.values():
        run()  # warm-up: compilation, worker start, allocator, cuDNN autotuning
    rates: dict[str, list[float]] = {name: [] for name in loops}
    images: dict[str, set[int]] = {name: set() for name in loops}
    held = [checkpoint_hold_ms(trainer)]  # as at every epoch's end, outside the timed rounds
    for _ in range(args.rounds):  # alternating, so that drift in the machine hits both alike
        for name, run in loops.items():
            rate, count = timed(run, env.device)
            rates[name].append(rate)
            images[name].add(count)
        held.append(checkpoint_hold_ms(trainer))
    stop.close()
    trainer.metrics.close()
    work = (f"work per round: {', '.join(f'{name} {sorted(counts)} images' for name, counts in images.items())}; "
            f"the project's trainer counted {trainer.state.step} optimizer steps (warm-up included)")  # fmt: skip
    lightning = lightning_rates(config, env, args)  # its own fit, after the others
    if isinstance(lightning, str):
        return rates, max(held), lightning, work
    return {**rates, "lightning": lightning}, max(held), "", work


def main() -> int:
    args = parse_args()
    with distributed(DistConfig(backend="auto", timeout_s=600)) as env, tempfile.TemporaryDirectory() as scratch:
        rates, held, lightning, work = measure(args, env, Path(scratch) / "run")
        median = {name: statistics.median(values) for name, values in rates.items()}
        if env.is_main:
            print(
                f"bench: model {args.model}, batch {args.batch}/process, {env.world_size} process(es) "
                f"({env.backend}, {env.device.type}), precision {args.precision}, channels_last "
                f"{args.channels_last}, compile {args.compile}, on_device {args.on_device}, "
                f"{args.steps} steps x {args.rounds} round(s)"
            )
            for name, value in median.items():
                print(f"{name:<10} {value:>10.0f} images/s   rounds: {' '.join(f'{r:.0f}' for r in rates[name])}")
            print(work)
            print(f"ratio project/bare {median['project'] / median['bare']:.3f}")
            if "lightning" in median:
                print(f"ratio project/lightning {median['project'] / median['lightning']:.3f}")
            else:
                print(f"lightning: {lightning}")
            print(f"checkpoint save holds training {held:.1f} ms (longest of {args.rounds + 1})")
    return 0


if __name__ == "__main__":
    exit_now(main())  # as train.py: no interpreter teardown (gloo's threads aborted it: "terminate called")

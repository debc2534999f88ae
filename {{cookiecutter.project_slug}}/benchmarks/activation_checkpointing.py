"""Activation memory and step time of the language model with and without trainer.activation_checkpointing.

    python benchmarks/activation_checkpointing.py [--block-size 512] [--batch 8] [--steps 10] [--device cuda]

In one process, the GPT of configs/model/gpt.yaml is built twice from the same seed and trained with
AdamW on the same random bytes: plain, then with its blocks checkpointed (engine/assembly/activation.py). For
each it reports the bytes of the tensors saved for backward by one forward (each storage once, the
parameters not counted; checkpoint's own copies of the blocks' inputs are not saved for backward, so
not counted: the CUDA peak counts them), on CUDA the peak memory allocated in a step, the median time
of an optimizer step, and the first step's loss, which must not change (its difference is reported).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from {{cookiecutter.package_name}}.config.strategies import BLOCKS as BLOCKS_KEY  # noqa: E402
from {{cookiecutter.package_name}}.engine.assembly.activation import checkpoint_activations  # noqa: E402
from {{cookiecutter.package_name}}.engine.assembly.components import build_model  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# What train.py checkpoints: the classes the BLOCKS key names (where the project has one), else found.
BLOCKS = list(OmegaConf.select(OmegaConf.load(CONFIGS / "train.yaml"), BLOCKS_KEY) or []) if BLOCKS_KEY else []
MIB = 2**20


def measure(checkpointed: bool, args: argparse.Namespace, tokens: torch.Tensor) -> dict:
    device = tokens.device
    torch.manual_seed(0)
    node = {**OmegaConf.to_container(OmegaConf.load(CONFIGS / "model" / "gpt.yaml")), "block_size": args.block_size,
            "width": args.width, "layers": args.layers}  # fmt: skip
    model = build_model(node).to(device)
    blocks = checkpoint_activations(model, BLOCKS) if checkpointed else []
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    parameters = {parameter.untyped_storage().data_ptr() for parameter in model.parameters()}

    def forward() -> torch.Tensor:
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())

    def step(loss: torch.Tensor) -> float:
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    saved: dict[int, int] = {}  # storage -> bytes

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = forward()
    first_loss = step(loss)
    for _ in range(args.warmup):
        step(forward())
    times, peaks, last_loss = [], [], first_loss
    for _ in range(args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        started = time.perf_counter()
        last_loss = step(forward())  # .item() waits for the device
        times.append(time.perf_counter() - started)
        if device.type == "cuda":
            peaks.append(torch.cuda.max_memory_allocated(device))
    return {"mode": "checkpointed" if checkpointed else "plain", "blocks": len(blocks), "device": device.type,
            "saved_bytes": sum(saved.values()), "peak_bytes": max(peaks) if peaks else None,
            "step_s": statistics.median(times) if times else None, "first_loss": first_loss,
            "last_loss": last_loss}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-size", type=int, default=512, help="bytes per window")
    parser.add_argument("--batch", type=int, default=8, help="windows per step")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after the measured first one")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (args.batch, args.block_size + 1), generator=generator).to(device)
    rows = []
    for checkpointed in (False, True):
        rows.append(measure(checkpointed, args, tokens))
        gc.collect()  # the first model gone before the second's peak is measured
        if device.type == "cuda":
            torch.cuda.empty_cache()
    plain, checkpointed = rows
    for row in rows:
        row["loss_diff"] = abs(row["first_loss"] - plain["first_loss"])
        print(json.dumps(row), flush=True)

    def mib(value: int | None) -> str:
        return "-" if value is None else f"{value / MIB:.1f}"

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    print(f"GPT width {args.width}, {args.layers} layers, AdamW, {args.batch} windows of {args.block_size} bytes, "
          f"{args.steps} timed steps on {device.type}")  # fmt: skip
    print(f"{'mode':<12} {'blocks':>6} {'saved MiB':>10} {'peak MiB':>9} {'step s':>8} {'first loss':>11} "
          f"{'loss diff':>10}")  # fmt: skip
    for row in rows:
        print(f"{row['mode']:<12} {row['blocks']:>6} {mib(row['saved_bytes']):>10} {mib(row['peak_bytes']):>9} "
              f"{seconds(row['step_s']):>8} {row['first_loss']:>11.6f} {row['loss_diff']:>10.2e}")  # fmt: skip
    less = plain["saved_bytes"] / max(checkpointed["saved_bytes"], 1)
    slower = f"{checkpointed['step_s'] / plain['step_s']:.2f}" if plain["step_s"] and checkpointed["step_s"] else "-"
    saved = f"{mib(plain['saved_bytes'])} MiB -> {mib(checkpointed['saved_bytes'])} MiB ({less:.1f} x less)"
    timed = f"{seconds(plain['step_s'])} s -> {seconds(checkpointed['step_s'])} s ({slower} x)"
    print(f"activation checkpointing: saved activations {saved}, step time {timed}, "
          f"first-step loss difference {checkpointed['loss_diff']:.1e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One plain weights file from any checkpoint of a run, a folder of shards or one file (ddp):
`python -m <package>.export CHECKPOINT OUT.pt` (or `OUT.safetensors`), or `<package>-export ...` once installed.

OUT holds the unwrapped model's state dict, tensors only, read without this project's code (torch.load with
weights_only, or safetensors). One process: shards are read whole. `--format` writes another format where the
project has one (engine/checkpoint/weights.py's weight_formats).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import torch

from .common.errors import ConfigError, fail
from .common.storage import local_path
from .engine.assembly.components import build_model, run_records
from .engine.checkpoint.files import NotACheckpoint, best_checkpoint, load_checkpoint, write_atomically
from .engine.checkpoint.trust import check_trusted, saved_config
from .engine.checkpoint.weights import has_ema, load_weights, weight_formats
from .engine.distributed.process_group import weights_fingerprint


def export(checkpoint: Path, out: Path, trust: bool = False, form: str = "plain") -> str:
    """Write the checkpoint's model weights (the EMA's, where the run kept one) to `out`; the line that says so.
    A config naming code outside the project is refused unless `trust`. `form`: "plain", or a weight_formats()."""
    if checkpoint.name == "best":
        checkpoint = best_checkpoint(checkpoint)
    if out.exists():
        raise ConfigError(f"{out} exists: give another output path (nothing is overwritten)")
    try:
        payload = load_checkpoint(checkpoint)
    except (NotACheckpoint, FileNotFoundError) as error:
        raise ConfigError(f"{error}; give a run's checkpoints/step_<N>.pt or step_<N>/") from None
    saved = saved_config(payload)
    check_trusted(saved, trust, "--trust-checkpoint")
    if not isinstance(saved.get("model"), dict):
        raise ConfigError(f"{checkpoint}: its config has no model node: not a run's checkpoint of this project")
    model = build_model(saved["model"])
    load_weights(checkpoint, model, payload)  # whatever strategy wrote it
    weights = model.state_dict()
    out.parent.mkdir(parents=True, exist_ok=True)
    kind = "EMA weights (trainer.ema)" if has_ema(checkpoint, payload) else "weights"  # what validation scored
    line = f"{kind} at step {payload['step']}: sha256 {weights_fingerprint(weights)}"
    said = line
    if form != "plain":
        said = weight_formats()[form].export_to(out, model, saved, line)
    elif out.suffix == ".safetensors":
        write_atomically(weights, out, safetensors_writer({"step": str(payload["step"]), "weights": line}))
    else:
        write_atomically(weights, out)
    for module in run_records():  # the training run's record beside OUT, where the project keeps one
        module.write_export_record(checkpoint, payload, out, line)
    return said


def safetensors_writer(metadata: dict[str, str]) -> Callable[[dict[str, torch.Tensor], BinaryIO], None]:
    """The weights as a safetensors file; tied tensors written as copies (safetensors keeps no shared storage, and
    load_state_dict ties them again)."""
    from safetensors.torch import save

    def write(weights: dict[str, torch.Tensor], file: BinaryIO) -> None:
        file.write(save({name: tensor.detach().contiguous().clone() for name, tensor in weights.items()}, metadata))

    return write


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = "a run's checkpoints/step_<N>.pt (ddp), step_<N>/ (sharded), or checkpoints/best (keep_best)"
    parser.add_argument("checkpoint", help=where)
    parser.add_argument("out", type=Path, help="the file to write (must not exist): .safetensors, else torch's .pt")
    formats = weight_formats()
    helps = "; ".join(module.FORMAT_HELP for module in formats.values())
    parser.add_argument("--format", choices=["plain", *formats], default="plain", help=helps or None)
    trust = "build a model whose config names code outside this project (only for a checkpoint you trust)"
    parser.add_argument("--trust-checkpoint", action="store_true", help=trust)
    args = parser.parse_args(argv)
    try:
        line = export(Path(local_path(args.checkpoint, "CHECKPOINT")), args.out, args.trust_checkpoint, args.format)
    except ConfigError as error:
        fail(str(error))
    print(f"wrote {args.out}: {line}")


if __name__ == "__main__":
    main()

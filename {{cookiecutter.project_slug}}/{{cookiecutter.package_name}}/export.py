"""One plain weights file from any checkpoint of a run, sharded (fsdp) or not (ddp):
`python -m {{ cookiecutter.package_name }}.export CHECKPOINT OUT.pt`, or `{{ cookiecutter.package_name }}-export ...` once installed.

OUT holds the unwrapped model's state dict, tensors only: `model.load_state_dict(torch.load(OUT,
weights_only=True))` puts the trained weights into the model the run's config builds, without
any of this project's code. One process, no process group: the shards are read whole.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .checkpoint import NotACheckpoint, check_format_version, load_checkpoint, write_atomically
from .components import build_model
from .config import ConfigError
from .distributed import weights_fingerprint
from .sharded_checkpoint import load_weights


def export(checkpoint: Path, out: Path) -> str:
    """Write the checkpoint's model weights to `out`; their fingerprint (as a run's end logs it)."""
    if out.exists():
        raise ConfigError(f"{out} exists: give another output path (nothing is overwritten)")
    try:
        payload = load_checkpoint(checkpoint)
    except (NotACheckpoint, FileNotFoundError) as error:
        raise ConfigError(f"{error}; give a run's checkpoints/step_<N>.pt or step_<N>/") from None
    check_format_version(checkpoint, payload)
    if checkpoint.is_dir():
        model = build_model(payload["config"]["model"])
        load_weights(checkpoint, model)
        weights = model.state_dict()
    else:
        weights = payload["model"]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(weights, out)
    return f"weights at step {payload['step']}: sha256 {weights_fingerprint(weights)}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a run's checkpoints/step_<N>.pt (ddp) or step_<N>/ (fsdp)")
    parser.add_argument("out", type=Path, help="the file to write (must not exist)")
    args = parser.parse_args(argv)
    try:
        line = export(args.checkpoint, args.out)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {args.out}: {line}")


if __name__ == "__main__":
    main()

"""The language-model demo against an anchor, a bare training loop of the same recipe (nanoGPT's CPU
one, not part of this project), on the same cores, side by side (docs/language_model.md):

    python benchmarks/language_model.py --anchor PATH/bare_gpt.py [--repeats 1]
        [--variant 'NAME|KEY=VALUE override ...' ...] [--anchor-args '500' --overrides '...']

Each round runs the anchor (`python ANCHOR`, one process, torch's threads = the cores; it must print
`final val LOSS nats/byte`), then each variant: `bash scripts/run_single.sh task=language_model` with
the variant's launcher keys and overrides (`OMP_NUM_THREADS=N` among them goes to the environment).
By default: the launcher's own choice (no keys), 2 processes x 1 thread, 1 process x 1 thread.
What to read, per variant: its final val_loss against the anchor's, and its wall time (start to exit,
for both: the start, the corpus, every evaluation included) over the anchor's. Run it on an otherwise
idle machine where you can; on a shared one the ratios within a round are what hold.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[1]
VARIANTS = [
    "launcher's choice|",
    "2 processes x 1 thread|NPROC_PER_NODE=2 OMP_NUM_THREADS=1",
    "1 process x 1 thread|NPROC_PER_NODE=1 OMP_NUM_THREADS=1",
]
ENVIRONMENT = ("OMP_NUM_THREADS",)  # a variant's word that goes to the environment, not the launcher


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchor", type=Path, required=True, help="the bare loop, e.g. nanoGPT's CPU recipe")
    parser.add_argument("--anchor-args", default="", help="its arguments (e.g. its number of steps)")
    parser.add_argument("--variant", action="append", help="'NAME|WORDS': keys and overrides (default: three)")
    parser.add_argument("--overrides", default="", help="for every variant, e.g. a shorter demo with --anchor-args")
    parser.add_argument("--repeats", type=int, default=1, help="rounds, each the anchor then every variant")
    return parser.parse_args()


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Seconds from start to exit, and the output."""
    started = time.monotonic()
    proc = subprocess.run(command, cwd=PROJECT_DIR, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{shlex.join(command[:4])} ... failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.monotonic() - started, proc.stdout + proc.stderr


def final_val_loss(run_dir: Path) -> tuple[float, int]:
    """The last evaluation's val_loss and its step (metrics.jsonl)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = [record for record in records if record["kind"] == "val"][-1]
    return last["val_loss"], last["step"]


def main() -> None:
    args = parse_args()
    variants = [spec.split("|", 1) for spec in (args.variant or VARIANTS)]
    scratch = Path(tempfile.mkdtemp(prefix="language_model_"))
    # Nothing inherited decides the threads: the anchor gets the cores, each variant what it says.
    base = {name: value for name, value in os.environ.items() if name not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    base |= {"PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}  # the launch script's Python: this one
    rows: list[tuple[int, str, float, float, str]] = []
    for repeat in range(args.repeats):
        anchor_env = {**base, "OMP_NUM_THREADS": str(cores())}
        seconds, output = timed([sys.executable, str(args.anchor), *shlex.split(args.anchor_args)], anchor_env)
        match = re.search(r"final val ([0-9.]+)", output)
        if not match:
            sys.exit(f"{args.anchor} printed no 'final val LOSS': {output[-500:]}")
        anchor_loss, anchor_seconds = float(match.group(1)), seconds
        rows.append((repeat, "anchor", anchor_loss, anchor_seconds, ""))
        print(f"round {repeat}: anchor {anchor_loss:.4f} nats/byte in {anchor_seconds:.1f} s", flush=True)
        for number, (name, spec) in enumerate(variants):
            words = shlex.split(spec)
            env = {**base, **dict(word.split("=", 1) for word in words if word.split("=")[0] in ENVIRONMENT)}
            passed = [word for word in words if word.split("=")[0] not in ENVIRONMENT] + shlex.split(args.overrides)
            run_dir = scratch / f"run_{repeat}_{number}"
            command = ["bash", "scripts/run_single.sh", f"RUN_DIR={run_dir}", "task=language_model", *passed]
            seconds, output = timed(command, env)
            loss, step = final_val_loss(run_dir)
            world = re.search(r"world size ([0-9]+), ([0-9]+) samples per process", output)
            shape = f"{world.group(1)} proc x {world.group(2)} windows, {step} steps" if world else f"{step} steps"
            rows.append((repeat, name, loss, seconds, shape))
            ratio = seconds / anchor_seconds
            print(f"round {repeat}: {name}: {loss:.4f} nats/byte in {seconds:.1f} s "
                  f"(loss {loss - anchor_loss:+.4f}, time x{ratio:.2f}; {shape})", flush=True)  # fmt: skip
    print(f"\n{cores()} cores; each round: the anchor, then the variants, one after the other")
    print(f"{'round':>5}  {'run':<28} {'val loss':>9} {'vs anchor':>10} {'time':>8} {'x anchor':>9}  shape")
    anchors = {repeat: (loss, seconds) for repeat, name, loss, seconds, _ in rows if name == "anchor"}
    for repeat, name, loss, seconds, shape in rows:
        anchor_loss, anchor_seconds = anchors[repeat]
        verdict = "" if name == "anchor" else ("  reached" if loss <= anchor_loss else "  short")
        verdict += "" if name == "anchor" or seconds <= anchor_seconds else ", slower"
        print(f"{repeat:>5}  {name:<28} {loss:9.4f} {loss - anchor_loss:+10.4f} {seconds:7.1f}s "
              f"{seconds / anchor_seconds:8.2f}x  {shape}{verdict}")  # fmt: skip


if __name__ == "__main__":
    main()

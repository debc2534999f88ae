"""What a whole tiny job costs to start and end through the launch script, against a bare torchrun
DDP script of the same model, side by side (docs/speed.md):

    python benchmarks/startup.py [--model resnet18] [--nproc 2] [--repeats 3]

- project: `bash scripts/run_single.sh` with one optimizer step per rank, a validation and a
  checkpoint (the launcher's checks, torchrun, the workers' checks, the run dir, the logs);
- bare: `torchrun --standalone` of a minimal DDP script (written here) doing 3 steps of the same
  model on random images.

They alternate, `--repeats` times each; the medians and their difference are what to read. Then the
project's last run line by line: when each milestone appeared on its console, after the launch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[1]

BARE = """
import os, torch, torch.distributed as dist, torch.nn.functional as F, torchvision
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torchvision.models.{model}(num_classes=10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
images, labels = torch.randn({batch}, 3, 32, 32), torch.randint(10, ({batch},))
for _ in range(3):
    optimizer.zero_grad()
    F.cross_entropy(model(images), labels).backward()
    optimizer.step()
dist.destroy_process_group()
"""
# What the project's console says, in the order it says it: the milestones of the line-by-line view.
MILESTONES = [
    ("run dir: ", "the launcher made the run dir and starts torchrun"),
    ("] run dir: ", "the workers have checked and formed their process group"),
    ("] model ", "the model is built and wrapped"),
    ("] final: ", "the last evaluation"),
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18", help="a torchvision model name, also configs/model/<name>.yaml")
    parser.add_argument("--nproc", type=int, default=2, help="processes per job")
    parser.add_argument("--batch", type=int, default=16, help="per process")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, alternating")
    return parser.parse_args()


def timed(command: list[str], cwd: Path) -> tuple[float, list[tuple[float, str]]]:
    """Seconds from start to exit, and each console line with the second it appeared."""
    started = time.monotonic()
    env = {**os.environ, "PYTHON": sys.executable}  # the launch script's Python: this one
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [(time.monotonic() - started, line.rstrip("\n")) for line in proc.stdout]  # type: ignore[union-attr]
    if proc.wait() != 0:
        sys.exit(f"{' '.join(command[:3])} ... failed:\n" + "\n".join(line for _, line in lines[-20:]))
    return time.monotonic() - started, lines


def main() -> None:
    args = parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="startup_"))
    bare = scratch / "bare.py"
    bare.write_text(BARE.format(model=args.model, batch=args.batch))
    bare_command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
                    str(bare)]  # fmt: skip
    job = [f"model={args.model}", "data=synthetic", "task=classification", f"data.batch_size={args.batch}",
           f"data.train_size={args.batch * args.nproc}", f"data.val_size={args.batch}", "trainer.epochs=1"]  # fmt: skip
    times: dict[str, list[float]] = {"project": [], "bare": []}
    lines: list[tuple[float, str]] = []
    for repeat in range(args.repeats):
        seconds, _ = timed(bare_command, scratch)
        times["bare"].append(seconds)
        run_dir = scratch / f"run_{repeat}"
        command = ["bash", "scripts/run_single.sh", f"NPROC_PER_NODE={args.nproc}", f"RUN_DIR={run_dir}", *job]
        seconds, lines = timed(command, PROJECT_DIR)
        times["project"].append(seconds)
    project, plain = statistics.median(times["project"]), statistics.median(times["bare"])
    print(f"{args.model}, {args.nproc} processes, median of {args.repeats} (alternating):")
    listed = {name: ", ".join(f"{seconds:.1f}" for seconds in values) for name, values in times.items()}
    print(f"  bare torchrun DDP script, 3 steps              {plain:6.1f} s   ({listed['bare']})")
    print(f"  run_single.sh: 1 step, validation, checkpoint  {project:6.1f} s   ({listed['project']})")
    print(f"  difference                                     {project - plain:+6.1f} s")
    print("the project's last run, line by line (seconds after the launch):")
    for marker, meaning in MILESTONES:
        when = next((at for at, line in lines if marker in line and (marker.startswith("]") or "[rank=" not in line)),
                    None)  # fmt: skip
        print(f"  {'-' if when is None else f'{when:5.1f}'}  {meaning}")
    print(f"  {times['project'][-1]:5.1f}  the launcher returned")


if __name__ == "__main__":
    main()

"""What the check for a non-finite loss or gradient (engine/nonfinite.py) costs a training step: the same
trainer's epoch timed with it on and off, rounds alternating, in one process.

    python benchmarks/nonfinite_check.py [--model small_cnn] [--batch 32] [--steps 40] [--rounds 5]

Off means: no per-step counts on the device and no per-gradient max-norm (the loss is still checked at
the log line, as before the check existed). The figures to read: the step times' difference (median and fastest round).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

PROJECT_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_DIR))

from {{cookiecutter.package_name}}.common.placement import DistEnv  # noqa: E402
from {{cookiecutter.package_name}}.common.run_dir import register_resolvers  # noqa: E402
from {{cookiecutter.package_name}}.config import register_configs, to_train_config  # noqa: E402
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer  # noqa: E402
from {{cookiecutter.package_name}}.engine.preemption import StopOnSigterm  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds of each, alternating")
    args = parser.parse_args()
    from hydra import compose, initialize_config_dir

    register_configs()
    register_resolvers()
    overrides = ["task=classification", f"model={args.model}", "data=synthetic", f"data.batch_size={args.batch}",
                 f"data.train_size={args.batch * args.steps}", "data.val_size=8", "trainer.log_every_n_steps=10",
                 "checkpoint.every_n_steps=0", "trainer.epochs=1000"]  # fmt: skip
    with initialize_config_dir(config_dir=str(PROJECT_DIR / "configs"), version_base="1.3"):
        config = to_train_config(compose(config_name="train", overrides=overrides))
    env = DistEnv(0, 0, 1, 1, "gloo", torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = build_trainer(config, env, Path(run_dir))
        stop = StopOnSigterm()
        times: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(args.rounds + 1):  # the first round of each warms up
            for on in (True, False):
                trainer.divergence.enabled = on  # off: the trainer's own check of the log line's sums alone
                if env.device.type == "cuda":
                    torch.cuda.synchronize()
                started = time.perf_counter()
                trainer.train_epoch(stop)
                if env.device.type == "cuda":
                    torch.cuda.synchronize()
                trainer.end_epoch()
                if round_:
                    times[on].append((time.perf_counter() - started) / args.steps * 1e3)
        stop.close()
    for name, figure in (("median", statistics.median), ("fastest", min)):  # fastest: where the CPU is shared
        on, off = figure(times[True]), figure(times[False])
        print(
            f"{args.model}, batch {args.batch}, {env.device}, {name} step: {off:.2f} ms without the check, "
            f"{on:.2f} ms with it ({on - off:+.2f} ms, {100 * (on - off) / off:+.1f}%)"
        )


if __name__ == "__main__":
    main()

"""The launch behind scripts/run_single.sh, run_multi.sh and the scripts of launch/modes/:

    python -m <package>.launch single|multi|<mode> [KEY=VALUE ...] [Hydra flags and overrides ...] [-- torchrun]

Its keys, then one job, a sweep or a mode; every mistake is one line and exit code 2 (docs/launching.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ..common.errors import fail
from ..common.run_dir import launch_environment
from .job import train
from .keys import SCRIPTS, LaunchArgs, LaunchError, parse_args, read_cluster_env, sweep_module, usage
from .modes import extra_modes
from .plan import plan, worker_environment
from .supervise import PACKAGE, Forwarder


def hydra_only(args: LaunchArgs) -> int:
    """--cfg, --info, --help and the like: train.py answers them in one process."""
    flags = [*args.hydra_flags, *(["--help"] if args.help else [])]
    command = [sys.executable, "-m", f"{PACKAGE}.train", *flags, *args.overrides]
    return subprocess.run(command, env={**os.environ, **worker_environment(dict(os.environ))}).returncode


def main(argv: Sequence[str] | None = None) -> int:
    forwarder = Forwarder()  # first: a signal during the checks stops the launch before torchrun
    try:
        return launch_main(list(sys.argv[1:] if argv is None else argv), forwarder)
    except LaunchError as error:
        fail(str(error))
    finally:
        forwarder.close()


def launch_main(argv: list[str], forwarder: Forwarder) -> int:
    modes = extra_modes()
    mode = argv.pop(0) if argv and argv[0] in (*SCRIPTS, *modes) else "single"
    args = parse_args(argv, mode)
    if mode in modes:  # its own keys' help, checks and start
        return int(modes[mode].main(args, dict(os.environ), forwarder))
    if args.help:
        print(usage(mode) + "\n", flush=True)
    if args.help or args.hydra_flags:
        return hydra_only(args)
    sweeps = sweep_module()
    if args.multirun and sweeps is None:
        raise LaunchError("-m: this project was made without sweeps (cookiecutter's sweeps=no): launch each "
                          "config as its own job")  # fmt: skip
    if args.multirun and mode != "single":
        raise LaunchError("-m (a sweep) runs on one node: use scripts/run_single.sh -m ...")
    launch = plan(mode, args, dict(os.environ), read_cluster_env(Path("scripts") / "cluster.env"))
    launch.env.update(launch_environment(mode, argv))  # for the run's record, where the project keeps one
    if sweeps is not None:
        if args.multirun:
            return int(sweeps.sweep(launch, args, forwarder))
        sweeps.check_one_job(launch)  # its keys without -m: one line
    # Many nodes: the same path on every node, RUN_DIR or outputs/RUN_NAME.
    run_dir = launch.values["RUN_DIR"] or (str(Path("outputs") / launch.values["RUN_NAME"]) if mode == "multi" else "")
    return train(launch, args, Path(run_dir) if run_dir else None, forwarder)


if __name__ == "__main__":
    sys.exit(main())

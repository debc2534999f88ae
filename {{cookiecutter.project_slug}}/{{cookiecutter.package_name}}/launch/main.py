"""The launch layer behind scripts/run_single.sh, run_multi.sh and the scripts of launch/modes/.

    python -m <package>.launch single|multi|<mode> [KEY=VALUE ...] [Hydra flags and overrides ...] [-- torchrun]

One table of launch keys (KEYS) with their defaults and help. A launch checks the keys, then
what needs no torch (preflight, in this process: the config, the backend, the run dir), then starts
torchrun once; every mistake is one line on stderr and exit code 2, with no traceback, also one that
the workers find as they start (engine/assembly/checks.py: the model, data and checkpoint). Upper-case
KEY=VALUE arguments are launch keys; Hydra's flags (--cfg job, --info, --help, -m) and overrides
go to the training; anything after `--` goes to torchrun. Keys a scheduler puts in the
environment (NODE_RANK, MASTER_ADDR, MASTER_PORT, NNODES, torchrun's PET_*) are used when the
command line does not give them.

The modules of launch/, one concern each: keys.py (the keys and the command line), plan.py
(torchrun's arguments and the workers' environment), checks.py (the checks before torchrun),
rendezvous.py (the nodes' meeting point), supervise.py (torchrun as a child, signals), job.py
(one training job), agent.py (torchrun itself, quieter). What a project was made with beyond these is
found where it is: sweep.py (-m, keys.sweep_module) and modes/ (modes that print what starts a job elsewhere,
or start torchrun on a module of their own).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from ..common.redaction import redact_text
from ..common.run_dir import launch_environment
from .job import train
from .keys import SCRIPTS, USER_ERROR_EXIT, LaunchArgs, LaunchError, parse_args, read_cluster_env, sweep_module, usage
from .modes import extra_modes
from .plan import plan, worker_environment
from .supervise import PACKAGE, Forwarder, say


def fail(message: str) -> NoReturn:
    say(f"error: {redact_text(message)}", err=True)
    sys.exit(USER_ERROR_EXIT)


def hydra_only(args: LaunchArgs) -> int:
    """--cfg, --info, --help and the like: train.py answers them in one process."""
    flags = [*args.hydra_flags, *(["--help"] if args.help else [])]
    command = [sys.executable, "-m", f"{PACKAGE}.train", *flags, *args.overrides]
    return subprocess.run(command, env={**os.environ, **worker_environment(dict(os.environ))}).returncode


def main(argv: Sequence[str] | None = None) -> int:
    forwarder = Forwarder()  # first: a signal during the checks stops the launch before torchrun
    try:
        return launch_main(list(sys.argv[1:] if argv is None else argv), forwarder)
    finally:
        forwarder.close()


def launch_main(argv: list[str], forwarder: Forwarder) -> int:
    modes = extra_modes()
    mode = argv.pop(0) if argv and argv[0] in (*SCRIPTS, *modes) else "single"
    try:
        args = parse_args(argv, mode)
        if mode in modes:  # its own keys' help, checks and start
            return int(modes[mode].main(args, dict(os.environ), forwarder))
        if args.help:
            print(usage(mode), flush=True)
            print(flush=True)
            return hydra_only(args)
        if args.hydra_flags:
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
        if mode == "multi":  # the same path on every node: RUN_DIR, or outputs/RUN_NAME
            run_dir: Path | None = Path(launch.values["RUN_DIR"] or Path("outputs") / launch.values["RUN_NAME"])
        else:
            run_dir = Path(launch.values["RUN_DIR"]) if launch.values["RUN_DIR"] else None
        return train(launch, args, run_dir, forwarder)
    except LaunchError as error:
        fail(str(error))


if __name__ == "__main__":
    sys.exit(main())

"""`bash scripts/check_comm.sh [KEY=VALUE ...] [dist.backend=...]`: the communication check
(<package>/comm_check.py) under torchrun, from the launcher's own keys: run_single.sh's on one node,
run_multi.sh's across nodes (NODE_RANK given, as for training). The config the workers compose and
the backend they would choose are checked first, each mistake one line; workers are never restarted."""

from __future__ import annotations

from pathlib import Path

from ..checks import checked_config
from ..keys import LaunchArgs, LaunchError, read_cluster_env, usage
from ..plan import plan
from ..rendezvous import check_rendezvous
from ..supervise import PACKAGE, Forwarder, torchrun

MODE, SCRIPT = "comm", "check_comm.sh"
SHARED_KEYS = ("NPROC_PER_NODE", "GPUS", "NODE_RANK", "NNODES", "MASTER_ADDR", "MASTER_PORT", "LOCAL_ADDR",
               "WAIT_FOR_MASTER_S", "WAIT_FOR_NODES_S", "RDZV_LAST_CALL_S", "RDZV_HEARTBEAT_S",
               "SHUTDOWN_TIMEOUT_S")  # fmt: skip
KEYS = ()


def main(args: LaunchArgs, environ: dict[str, str], forwarder: Forwarder) -> int:
    """The check's exit code (0: every collective passed), or its keys' help."""
    if args.help:
        print(usage(MODE), flush=True)
        return 0
    if args.multirun:
        raise LaunchError("-m (a sweep) runs on one node: use scripts/run_single.sh -m ...")
    launch = plan(MODE, args, environ, read_cluster_env(Path("scripts") / "cluster.env"))
    checked_config(args.overrides, launch)  # what the workers compose (the dist section), and their backend
    check_rendezvous(launch, lambda: forwarder.signal != 0)
    return torchrun(launch, f"{PACKAGE}.comm_check", args.overrides, forwarder)

"""A checked launch (Launch): the processes, GPUs and nodes from the keys, torchrun's arguments and the workers'
environment (docs/launching.md). Nothing is started and nothing written here."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..common.capacity import cpu_cores
from ..common.placement import visible_gpu_count
from ..common.run_dir import DEBUG_DIR_ENV, STORE_ADDRESS_ENV
from .keys import LaunchArgs, LaunchError, resolve_keys, whole_number

SOCKET_INTERFACES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")  # where gloo's and NCCL's sockets listen


@dataclass
class Launch:
    """A checked launch: torchrun's arguments and the workers' environment."""

    mode: str
    values: dict[str, str]
    nproc: int
    gpus: int | None  # GPUS=...: how many; None when not given
    torchrun_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def check_gpus(values: dict[str, str]) -> tuple[int | None, dict[str, str]]:
    gpus = values["GPUS"]
    if not gpus:
        return None, {}
    if not re.fullmatch(r"[0-9]+(,[0-9]+)*", gpus):
        raise LaunchError(f"GPUS={gpus}: give GPU indices separated by commas, e.g. GPUS=0,1,2,3")
    listed = gpus.split(",")
    if len(set(listed)) != len(listed):
        raise LaunchError(f"GPUS={gpus} lists a GPU twice: list each GPU once")
    return len(listed), {"CUDA_VISIBLE_DEVICES": gpus}


def unless_set(environ: dict[str, str], defaults: dict[str, str]) -> dict[str, str]:
    """`defaults`, each but where the user set it in `environ`."""
    return {name: environ.get(name) or value for name, value in defaults.items()}


def worker_environment(environ: dict[str, str], threads: int = 1) -> dict[str, str]:
    """What the launch sets for the workers, unless the user set it: `threads` per process, and MKL_CBWR:
    Intel MKL may give a matrix product other low bits when its operands lie at other memory alignments,
    and a restarted worker lays them out anew; STRICT makes CPU results depend on the inputs only, which
    bit-exact resume on CPUs needs. The user's OMP_NUM_THREADS must be a whole number of at least 1
    (OpenMP and torch ignore another, or warn in every worker)."""
    given = environ.get("OMP_NUM_THREADS") or ""
    if given and not (re.fullmatch(r"[0-9]+", given) and int(given) >= 1):
        raise LaunchError(f"OMP_NUM_THREADS={given}: give a whole number of threads per process, at least 1 "
                          f"(e.g. OMP_NUM_THREADS={threads}), or unset it and the launch sets {threads}")  # fmt: skip
    return unless_set(environ, {"OMP_NUM_THREADS": str(threads), "MKL_CBWR": "AUTO,STRICT"})


def debug_environment(environ: dict[str, str]) -> dict[str, str]:
    """DEBUG=1: what the workers get to diagnose a hang, unless the user set it (docs/debugging.md)."""
    defaults = {
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",  # all ranks call the same collectives? (INFO on gloo: process_group.py)
        "NCCL_DEBUG": "INFO",
        flight_recorder_size_variable(): "2000",  # NCCL's flight recorder: each rank's last 2000 collectives...
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",  # ...written out when one times out
    }
    return unless_set(environ, defaults)


def flight_recorder_size_variable() -> str:
    """torch 2.11 renamed TORCH_NCCL_TRACE_BUFFER_SIZE, and warns on every rank at the old name."""
    from importlib.metadata import version

    major, minor = (int(part) for part in re.findall(r"[0-9]+", version("torch"))[:2])
    return "TORCH_FR_BUFFER_SIZE" if (major, minor) >= (2, 11) else "TORCH_NCCL_TRACE_BUFFER_SIZE"


def debug_dir_environment(debug_dir: Path, environ: dict[str, str]) -> dict[str, str]:
    """DEBUG=1: where the workers' debug files go (NCCL's, and their own: DEBUG_DIR_ENV)."""
    defaults = {
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{debug_dir}/nccl_trace_rank_",  # the flight recorder; + the rank
        "NCCL_DEBUG_FILE": f"{debug_dir}/nccl_%h_%p.log",  # NCCL's INFO lines, per host and pid, off the console
    }
    return {**unless_set(environ, defaults), DEBUG_DIR_ENV: str(debug_dir)}


def plan(mode: str, args: LaunchArgs, environ: dict[str, str], cluster: dict[str, str]) -> Launch:
    """Check the keys and build torchrun's arguments (nothing is started, nothing written)."""
    values = resolve_keys(args.keys, mode, environ, cluster)
    gpus, gpu_env = check_gpus(values)
    devices = gpus if gpus is not None else visible_gpu_count(environ)
    if not values["NPROC_PER_NODE"]:  # one per GPU; on CPUs one (its threads share the cores), or two for nodes
        values["NPROC_PER_NODE"] = str(devices or (1 if mode == "single" else 2))
    nproc = whole_number(values, "NPROC_PER_NODE", 1)
    max_restarts = whole_number(values, "MAX_RESTARTS", 0) if "MAX_RESTARTS" in values else 0  # a mode without: never
    shutdown = whole_number(values, "SHUTDOWN_TIMEOUT_S", 0)
    launch = Launch(mode, values, nproc, gpus)
    threads = 1 if devices else max(1, cpu_cores() // nproc)  # on CPUs the cores are split among the processes
    launch.env = {**worker_environment(environ, threads), **gpu_env, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(shutdown)}
    if values.get("DEBUG", "0") not in ("0", "1"):
        raise LaunchError(f"DEBUG={values['DEBUG']}: give DEBUG=1 (diagnose a hang) or DEBUG=0")
    if values.get("DEBUG") == "1":
        launch.env.update(debug_environment(environ))
    common = [f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}"]
    if mode == "multi" or values.get("NODE_RANK"):  # another mode given a NODE_RANK: nodes too
        launch.torchrun_args = common + multi_node_args(values, launch.env)
    else:
        launch.torchrun_args = ["--standalone", *common]
        # One node listens on 127.0.0.1 alone: torchrun's stores (agent.py), gloo's and NCCL's sockets.
        interface = interface_of("127.0.0.1") or "lo"
        launch.env[STORE_ADDRESS_ENV] = "127.0.0.1"
        launch.env.update(unless_set(environ, dict.fromkeys(SOCKET_INTERFACES, interface)))
    launch.torchrun_args += args.torchrun_flags
    return launch


def multi_node_args(values: dict[str, str], env: dict[str, str]) -> list[str]:
    """Check the multi-node keys; torchrun's rendezvous arguments."""
    if not values["NODE_RANK"]:
        raise LaunchError("NODE_RANK is required: NODE_RANK=0 on the first node, 1, 2, ... on the others")
    node_rank = whole_number(values, "NODE_RANK", 0)
    whole_number(values, "WAIT_FOR_MASTER_S", 0)
    whole_number(values, "WAIT_FOR_NODES_S", 1)
    last_call = whole_number(values, "RDZV_LAST_CALL_S", 0)
    heartbeat = whole_number(values, "RDZV_HEARTBEAT_S", 1)
    port = whole_number(values, "MASTER_PORT", 1)
    if port > 65535:
        raise LaunchError(f"MASTER_PORT={port} is outside 1..65535")
    nnodes = values["NNODES"]
    if match := re.fullmatch(r"([0-9]+):([0-9]+)", nnodes):
        min_nodes, max_nodes = int(match.group(1)), int(match.group(2))
        if min_nodes < 1:
            raise LaunchError(f"NNODES={nnodes}: MIN must be at least 1")
        if min_nodes > max_nodes:
            raise LaunchError(f"NNODES={nnodes}: MIN is larger than MAX; give NNODES=MIN:MAX with MIN <= MAX")
    else:
        max_nodes = whole_number(values, "NNODES", 1)
    if node_rank >= max_nodes:
        raise LaunchError(f"NODE_RANK={node_rank} is outside 0..{max_nodes - 1} for NNODES={nnodes}")
    if not values["MASTER_ADDR"]:
        if node_rank != 0:
            raise LaunchError(
                f"MASTER_ADDR is required on node {node_rank}: give node 0's address, e.g. MASTER_ADDR=node001"
            )
        values["MASTER_ADDR"] = socket.gethostname()
    address = values["MASTER_ADDR"]
    try:
        socket.getaddrinfo(address, port)
    except OSError:
        raise LaunchError(
            f"MASTER_ADDR={address} does not resolve on this machine: give node 0's address as every node "
            "can reach it (an IP address, or a name in DNS or /etc/hosts)"
        ) from None
    # One run dir name on every node without typing it: the rendezvous point names the run.
    name = values.get("RUN_NAME") or f"multi_{address}_{port}"
    values["RUN_NAME"] = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    args = []
    if values["LOCAL_ADDR"]:  # this node's own address: where its stores listen, not every interface
        args.append(f"--local-addr={values['LOCAL_ADDR']}")
        env[STORE_ADDRESS_ENV] = values["LOCAL_ADDR"]
        if interface := interface_of(values["LOCAL_ADDR"]):  # gloo and NCCL take theirs from the hostname: loopback?
            env.update(unless_set(dict(os.environ), dict.fromkeys(SOCKET_INTERFACES, interface)))
    if ":" not in nnodes:
        return [*args, f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--master-addr={address}",
                f"--master-port={port}"]  # fmt: skip
    # Elastic, node 0 hosting the c10d rendezvous: the workers get a fresh store every round (torchrun's shared
    # store keeps the last round's keys).
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return [*args, f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={address}:{port}",
            f"--rdzv-id={values['RUN_NAME']}",
            f"--rdzv-conf=is_host={int(node_rank == 0)},last_call_timeout={last_call},"
            f"keep_alive_interval={heartbeat},keep_alive_max_attempt=3"]  # fmt: skip


def interface_of(address: str) -> str | None:
    """The network interface that holds `address` (Linux, `ip -o -4 addr`), or None."""
    try:
        listing = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    except OSError:
        return None
    for parts in (line.split() for line in listing.splitlines()):
        if len(parts) > 3 and parts[3].split("/")[0] == address:
            return parts[1]
    return None

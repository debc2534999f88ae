"""The launch layer behind scripts/run_single.sh, run_multi.sh and check_comm.sh.

    python -m {{ cookiecutter.package_name }}.launch single|multi|comm [KEY=VALUE ...] [Hydra flags and overrides ...] [-- torchrun flags]

One table of launch keys (KEYS) with their defaults and help. A launch checks the keys, then
the config, data and checkpoint (preflight, in this process), then starts torchrun once; every
mistake before that is one line on stderr and exit code 2, with no traceback. Upper-case
KEY=VALUE arguments are launch keys; Hydra's flags (--cfg job, --info, --help, -m) and overrides
go to the training; anything after `--` goes to torchrun. Keys a scheduler puts in the
environment (NODE_RANK, MASTER_ADDR, MASTER_PORT, NNODES, torchrun's PET_*) are used when the
command line does not give them.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import NoReturn

from .capacity import available_memory, check_processes_fit, oom_kills, oom_line, peak_rss, too_many_for_the_cores
from .redaction import redact_text
from .rundir import (
    CONTROL_DIR_ENV,
    FAILED_MARKER,
    FINISHED_MARKER,
    STOPPED_MARKER,
    STORE_ADDRESS_ENV,
    clear_markers,
    read_marker,
)

PACKAGE = "{{ cookiecutter.package_name }}"
USER_ERROR_EXIT = 2


class LaunchError(ValueError):
    """A mistake in the launch; reported as one line."""


@dataclass(frozen=True)
class Key:
    name: str
    default: str
    help: str
    env: tuple[str, ...] = ()  # read from the environment when the command line does not give the key
    modes: tuple[str, ...] = ("single", "multi", "comm")


KEYS = (
    Key("NPROC_PER_NODE", "", "processes on this machine (default: the visible GPUs, or 2 without one)",
        env=("NPROC_PER_NODE", "PET_NPROC_PER_NODE")),
    Key("GPUS", "", "the GPUs to use, e.g. GPUS=0,1,2,3: CUDA_VISIBLE_DEVICES, and one process per listed GPU"),
    Key("MAX_RESTARTS", "3", "times torchrun restarts failed workers; they resume from the newest checkpoint",
        env=("PET_MAX_RESTARTS",), modes=("single", "multi")),
    Key("RUN_DIR", "", "the run dir (default: a new outputs/<date>_<time>); an existing one is resumed",
        modes=("single",)),
    Key("SWEEP_DIR", "", "with -m: the sweep's dir (default: a new outputs/sweep_<date>_<time>); "
        "an existing one is continued", modes=("single",)),
    Key("NODE_RANK", "", "this node's rank: 0 on the first node, 1, 2, ... on the others",
        env=("NODE_RANK", "PET_NODE_RANK", "GROUP_RANK"), modes=("multi", "comm")),
    Key("NNODES", "2", "N: static, exactly N nodes; MIN:MAX: elastic (c10d rendezvous; nodes may join and leave)",
        env=("NNODES", "PET_NNODES"), modes=("multi", "comm")),
    Key("MASTER_ADDR", "", "node 0's address, reachable from every node (required on nodes other than 0)",
        env=("MASTER_ADDR", "PET_MASTER_ADDR"), modes=("multi", "comm")),
    Key("MASTER_PORT", "29500", "a free port on node 0", env=("MASTER_PORT", "PET_MASTER_PORT"),
        modes=("multi", "comm")),
    Key("RUN_NAME", "", "the run dir is outputs/RUN_NAME on every node (default: multi_<MASTER_ADDR>_<MASTER_PORT>)",
        modes=("multi",)),
    Key("LOCAL_ADDR", "", "this node's address, where its hostname does not resolve to it", modes=("multi", "comm")),
    Key("WAIT_FOR_MASTER_S", "120", "how long nodes other than 0 wait for node 0's port", modes=("multi", "comm")),
    Key("WAIT_FOR_NODES_S", "600", "how long a node waits for all NNODES (MIN of MIN:MAX) to join before it gives up",
        modes=("multi", "comm")),
    Key("RDZV_LAST_CALL_S", "5", "elastic: how long the rendezvous waits for more nodes once MIN have come",
        modes=("multi", "comm")),
    Key("DEBUG", "0", "1: diagnose a hang, into <run dir>/debug/: torch.distributed and NCCL debug logs, NCCL's "
        "flight recorder, every rank's Python stack when a step outlasts dist.timeout_s and on kill -USR1 <pid> "
        "(docs/debugging.md)", modes=("single", "multi")),
    Key("SHUTDOWN_TIMEOUT_S", "100", "how long torchrun lets workers checkpoint after SIGTERM before it kills them "
        "(Slurm's --signal=TERM@120 leaves 120 s)"),
)  # fmt: skip
KEYS_BY_NAME = {key.name: key for key in KEYS}

# Hydra's own flags: train.py handles them in one process (they print, they do not train).
HYDRA_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-dir", "-cd"}
HYDRA_FLAGS = {"--hydra-help", "--version", "--resolve", "--run", "-r"}
INFO_TOPICS = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


@dataclass
class LaunchArgs:
    keys: dict[str, str] = field(default_factory=dict)  # from the command line
    overrides: list[str] = field(default_factory=list)  # Hydra overrides
    hydra_flags: list[str] = field(default_factory=list)  # --cfg job, --info, ...
    torchrun_flags: list[str] = field(default_factory=list)  # after --
    multirun: bool = False
    help: bool = False


def parse_args(argv: Sequence[str], mode: str) -> LaunchArgs:
    """Sort the command line into launch keys, Hydra flags and overrides, and torchrun's flags."""
    args = LaunchArgs()
    known = [key.name for key in KEYS if mode in key.modes]
    items = iter(argv)
    for item in items:
        if item == "--":
            args.torchrun_flags = list(items)
            break
        if match := re.fullmatch(r"([A-Z][A-Z0-9_]*)=(.*)", item, flags=re.S):
            if match.group(1) not in known:
                raise LaunchError(
                    f"unknown key {match.group(1)}; known keys: {' '.join(known)} "
                    "(Hydra overrides are lower case, e.g. trainer.epochs=3)"
                )
            args.keys[match.group(1)] = match.group(2)
        elif item in ("-m", "--multirun"):
            args.multirun = True
        elif item in ("-h", "--help"):
            args.help = True
        elif item in HYDRA_FLAGS_WITH_VALUE:
            args.hydra_flags += [item, next(items, "")]
        elif (
            item in (*HYDRA_FLAGS, "--info", "-i")
            or item.split("=", 1)[0] in HYDRA_FLAGS_WITH_VALUE
            or (item in INFO_TOPICS and args.hydra_flags[-1:] in (["--info"], ["-i"]))
        ):
            args.hydra_flags.append(item)
        elif item.startswith("-"):
            raise LaunchError(
                f"unknown flag {item}: give torchrun's flags after --, e.g. `-- {item}`; "
                "Hydra's are --cfg, --info, --help, -m"
            )
        else:
            args.overrides.append(item)
    return args


def read_cluster_env(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of scripts/cluster.env (comments and blank lines skipped)."""
    if not path.is_file():
        return {}
    found = {}
    for line in path.read_text().splitlines():
        if match := re.fullmatch(r"\s*(?:export\s+)?([A-Z][A-Z0-9_]*)=(.*?)\s*", line):
            found[match.group(1)] = match.group(2).strip("\"'")
    return found


def resolve_keys(given: dict[str, str], mode: str, environ: dict[str, str], cluster: dict[str, str]) -> dict[str, str]:
    """Each key's value: the command line, else the environment (a scheduler's), else
    scripts/cluster.env (multi-node defaults of this cluster), else the default."""
    values = {}
    for key in KEYS:
        if mode not in key.modes:
            continue
        from_env = next((environ[name] for name in key.env if environ.get(name)), None)
        from_cluster = cluster.get(key.name) if mode != "single" else None
        values[key.name] = next(v for v in (given.get(key.name), from_env, from_cluster, key.default) if v is not None)
    return values


def whole_number(values: dict[str, str], name: str, least: int) -> int:
    value = values[name]
    if not re.fullmatch(r"[0-9]+", value):
        raise LaunchError(f"{name}={value} is not a whole number; give e.g. {name}={least}")
    if int(value) < least:
        raise LaunchError(f"{name}={value} must be at least {least}")
    return int(value)


def visible_gpu_count() -> int:
    """The GPUs this job may use: CUDA_VISIBLE_DEVICES when set, else what torch sees."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return len([item for item in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if item.strip()])
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


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


def worker_environment(environ: dict[str, str]) -> dict[str, str]:
    """What the launch sets for the workers, unless the user set it: one thread per process (they
    share the cores), and MKL_CBWR: Intel MKL may give a matrix product other low bits when its
    operands lie at other memory alignments, and a restarted worker lays them out anew; STRICT
    makes CPU results depend on the inputs only, which bit-exact resume on CPUs needs."""
    defaults = {"OMP_NUM_THREADS": "1", "MKL_CBWR": "AUTO,STRICT"}
    return {name: environ.get(name) or value for name, value in defaults.items()}


def debug_environment(environ: dict[str, str]) -> dict[str, str]:
    """DEBUG=1: what the workers get to diagnose a hang, unless the user set it (docs/debugging.md).
    The files these write go to the run dir: see debug_dir_environment."""
    defaults = {
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",  # checks that all ranks call the same collectives (INFO on gloo: hangs.py)
        "NCCL_DEBUG": "INFO",
        flight_recorder_size_variable(): "2000",  # NCCL's flight recorder: each rank's last 2000 collectives...
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",  # ...written out when one times out
    }
    return {name: environ.get(name) or value for name, value in defaults.items()}


def flight_recorder_size_variable() -> str:
    """torch 2.11 renamed TORCH_NCCL_TRACE_BUFFER_SIZE, and warns on every rank at the old name."""
    from importlib.metadata import version

    major, minor = (int(part) for part in re.findall(r"[0-9]+", version("torch"))[:2])
    return "TORCH_FR_BUFFER_SIZE" if (major, minor) >= (2, 11) else "TORCH_NCCL_TRACE_BUFFER_SIZE"


def debug_dir_environment(debug_dir: Path, environ: dict[str, str]) -> dict[str, str]:
    """DEBUG=1: where the workers' debug files go (the workers' stacks: hangs.py)."""
    from .hangs import DEBUG_DIR_ENV

    defaults = {
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{debug_dir}/nccl_trace_rank_",  # the flight recorder; + the rank
        "NCCL_DEBUG_FILE": f"{debug_dir}/nccl_%h_%p.log",  # NCCL's INFO lines, per host and pid, off the console
    }
    return {**{name: environ.get(name) or value for name, value in defaults.items()}, DEBUG_DIR_ENV: str(debug_dir)}


def plan(mode: str, args: LaunchArgs, environ: dict[str, str], cluster: dict[str, str]) -> Launch:
    """Check the keys and build torchrun's arguments (nothing is started, nothing written)."""
    values = resolve_keys(args.keys, mode, environ, cluster)
    gpus, gpu_env = check_gpus(values)
    if not values["NPROC_PER_NODE"]:
        values["NPROC_PER_NODE"] = str(gpus if gpus is not None else (visible_gpu_count() or 2))
    nproc = whole_number(values, "NPROC_PER_NODE", 1)
    max_restarts = whole_number(values, "MAX_RESTARTS", 0) if "MAX_RESTARTS" in values else 0  # comm: never
    shutdown = whole_number(values, "SHUTDOWN_TIMEOUT_S", 0)
    launch = Launch(mode, values, nproc, gpus)
    launch.env = {**worker_environment(environ), **gpu_env, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(shutdown)}
    if values.get("DEBUG", "0") not in ("0", "1"):
        raise LaunchError(f"DEBUG={values['DEBUG']}: give DEBUG=1 (diagnose a hang) or DEBUG=0")
    if values.get("DEBUG") == "1":
        launch.env.update(debug_environment(environ))
    common = [f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}"]
    if mode == "multi" or (mode == "comm" and values["NODE_RANK"]):
        launch.torchrun_args = common + multi_node_args(values, launch.env)
    else:
        launch.torchrun_args = ["--standalone", *common]
        launch.env.update(loopback_only(environ))
    launch.torchrun_args += args.torchrun_flags
    return launch


def loopback_only(environ: dict[str, str]) -> dict[str, str]:
    """A job on one node listens on 127.0.0.1 alone: torchrun's store (agent.py), gloo's and NCCL's
    sockets (unless the user chose their interfaces)."""
    interface = interface_of("127.0.0.1") or "lo"
    own = {name: environ.get(name) or interface for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
    return {STORE_ADDRESS_ENV: "127.0.0.1", **own}


def multi_node_args(values: dict[str, str], env: dict[str, str]) -> list[str]:
    """Check the multi-node keys; torchrun's rendezvous arguments."""
    if not values["NODE_RANK"]:
        raise LaunchError("NODE_RANK is required: NODE_RANK=0 on the first node, 1, 2, ... on the others")
    node_rank = whole_number(values, "NODE_RANK", 0)
    whole_number(values, "WAIT_FOR_MASTER_S", 0)
    whole_number(values, "WAIT_FOR_NODES_S", 1)
    last_call = whole_number(values, "RDZV_LAST_CALL_S", 0)
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
        interface = interface_of(values["LOCAL_ADDR"])
        if interface:  # gloo and NCCL take their interface from the hostname, which may resolve to loopback
            for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                env[name] = os.environ.get(name) or interface
    if ":" not in nnodes:
        return [*args, f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--master-addr={address}",
                f"--master-port={port}"]  # fmt: skip
    # Elastic: node 0 hosts the c10d rendezvous; nodes may join (the job restarts with the larger
    # world and resumes) and leave (it goes on with the smaller one, down to MIN). Workers get a
    # fresh store every round: torchrun's shared store keeps the last round's keys.
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return [*args, f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={address}:{port}",
            f"--rdzv-id={values['RUN_NAME']}",
            f"--rdzv-conf=is_host={int(node_rank == 0)},last_call_timeout={last_call}"]  # fmt: skip


def interface_of(address: str) -> str | None:
    """The network interface that holds `address` (Linux, `ip -o -4 addr`), or None."""
    try:
        listing = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    except OSError:
        return None
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[3].split("/")[0] == address:
            return parts[1]
    return None


def require_free_port(port: int) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            raise LaunchError(
                f"MASTER_PORT={port} is already in use on this machine: pick another, e.g. MASTER_PORT={port + 1}"
            ) from None


def wait_for_master(address: str, port: int, seconds: int) -> None:
    """A bounded wait until node 0 listens, then a hint."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((address, port), timeout=2).close()
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise LaunchError(
                    f"node 0 is not reachable at {address}:{port} after {seconds} s: start node 0 first, check "
                    f"MASTER_ADDR and MASTER_PORT, and test with: nc -zv {address} {port}"
                ) from None
            time.sleep(1)


def check_rendezvous(launch: Launch) -> None:
    """Node 0 must own MASTER_PORT; the other nodes wait for it (bounded)."""
    if "--standalone" in launch.torchrun_args:
        return
    values = launch.values
    if values["NODE_RANK"] == "0":
        require_free_port(int(values["MASTER_PORT"]))
    else:
        wait_for_master(values["MASTER_ADDR"], int(values["MASTER_PORT"]), int(values["WAIT_FOR_MASTER_S"]))


def new_dir(prefix: str = "") -> Path:
    """A new dir under outputs/, never one that exists (mkdir is atomic: two jobs started in the
    same second still get different dirs)."""
    base = Path("outputs") / f"{prefix}{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}"
    base.parent.mkdir(parents=True, exist_ok=True)
    for suffix in itertools.count():
        candidate = base if suffix == 0 else base.with_name(f"{base.name}_{suffix}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def describe_composition_error(error: BaseException) -> str:
    """Hydra's and OmegaConf's errors (several lines) made into one that says what to change."""
    text = f"{error}\n{error.__cause__ or ''}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    detail = lines[0].removeprefix("In 'train': ")
    if any(line.startswith("Available options") for line in lines):
        listed = lines[next(i for i, line in enumerate(lines) if line.startswith("Available options")) + 1 :]
        choices = [line for line in listed if line.isidentifier() and not line.startswith("base_")]
        detail += f"; choose one of: {', '.join(choices)}"
    else:
        noise = ("full_key", "object_type", "reference_type", "Set the environment")
        detail += "".join(f": {line}" for line in lines[1:2] if not line.startswith(noise))
    return f"{detail} (fix that override and launch again)"


def compose_train_config(overrides: list[str]):  # noqa: ANN201 (a DictConfig; omegaconf imported lazily)
    """configs/train.yaml with the overrides, composed as the workers will; one line if it fails."""
    from hydra import compose, initialize_config_dir

    from .config import config_dir, register_configs
    from .rundir import register_resolvers

    register_configs()
    register_resolvers()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return compose(config_name="train", overrides=overrides)
    except Exception as error:
        raise LaunchError(describe_composition_error(error)) from None


def check_comm_config(overrides: list[str], launch: Launch) -> None:
    """What check_comm.sh's workers compose (the dist section) and the backend they would choose."""
    import torch.distributed

    from .config import ConfigError, to_train_config
    from .distributed import choose_backend

    try:
        config = to_train_config(compose_train_config(overrides))
        choose_backend(config.dist.backend, launch.gpus if launch.gpus is not None else visible_gpu_count(),
                       launch.nproc, torch.distributed.is_mpi_available())  # fmt: skip
    except ConfigError as error:
        raise LaunchError(str(error)) from None


def preflight(overrides: list[str], run_dir: Path | None, launch: Launch) -> Path | None:
    """Compose and check the config as the workers will, with this launch's processes and GPUs, the
    data sets, model, optimizer and task, the checkpoint a run dir would resume from, and whether this
    machine can hold that many processes. The run dir, its `${...}` resolved as the workers would."""
    from .config import ConfigError
    from .entry import check_launch

    cfg = compose_train_config(overrides)
    run_dir = resolved_run_dir(run_dir, cfg)
    gpus = launch.gpus if launch.gpus is not None else visible_gpu_count()
    nodes = int(launch.values["NNODES"].split(":")[-1]) if launch.mode == "multi" else 1
    try:
        model = check_launch(cfg, run_dir, launch.nproc, gpus, launch.nproc * nodes)
    except ConfigError as error:
        raise LaunchError(str(error)) from None
    weights = sum(tensor.numel() * tensor.element_size() for tensor in model.state_dict().values())
    per_process = peak_rss() + 3 * weights  # what building them took here, and gradients and optimizer state
    if refusal := check_processes_fit(launch.nproc, per_process, gpus > 0, available_memory()):
        raise LaunchError(refusal)
    if warning := too_many_for_the_cores(launch.nproc, gpus > 0):
        say(warning, err=True)
    return run_dir


def resolved_run_dir(run_dir: Path | None, cfg) -> Path | None:  # noqa: ANN001 (a DictConfig)
    """RUN_DIR as the workers will see it: a `${...}` in it resolved against the config (the lock and
    the workers must agree on one folder), and refused when it names a file."""
    from omegaconf import OmegaConf

    if run_dir is not None and "${" in str(run_dir):
        probe = cfg.copy()
        OmegaConf.set_struct(probe, False)
        probe.launch_run_dir = str(run_dir)
        try:
            run_dir = Path(str(probe.launch_run_dir))
        except Exception as error:
            raise LaunchError(f"RUN_DIR={run_dir}: {describe_composition_error(error)}") from None
    if run_dir is not None and run_dir.exists() and not run_dir.is_dir():
        raise LaunchError(f"RUN_DIR={run_dir} is a file, not a run dir: give a folder (a new path starts a new run)")
    return run_dir


FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Forwarder:
    """From the launcher's start: remembers the first SIGTERM, SIGINT or SIGHUP (a closed terminal)
    and passes it on to torchrun while it runs. A signal before torchrun starts means it never does."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.signal = 0  # the first stop signal this launcher received: its exit code says which
        self.previous = {sig: signal.signal(sig, self.handle) for sig in FORWARDED_SIGNALS}

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.signal = self.signal or signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def stopped_before_start(self) -> int | None:
        """128 + the signal if one came before torchrun started (said in one line), else None."""
        if not self.signal:
            return None
        say(f"stopped by {signal.Signals(self.signal).name} before torchrun started: nothing was trained", err=True)
        return 128 + self.signal

    def run(self, command: list[str], env: dict[str, str], failed: Callable[[], bool] = lambda: False,
            nodes: NodeWait | None = None) -> int:  # fmt: skip
        """torchrun until it ends, or until a worker reports an error no restart can fix (`failed`
        says so), or until the nodes did not all come (`nodes`): then torchrun is killed, and its
        workers die with it."""
        if (code := self.stopped_before_start()) is not None:
            return code
        self.child = subprocess.Popen(command, env=env, preexec_fn=own_group_dying_with_parent)
        started = time.monotonic()
        while (code := self.child.poll()) is None:
            if failed():
                self.stop_child()
                return 1
            if nodes is not None and not nodes.done:
                nodes.done = has_children(self.child.pid)  # torchrun starts workers once all nodes came
                if not nodes.done and nodes.overdue(time.monotonic() - started):
                    self.stop_child()
                    raise LaunchError(nodes.give_up())
            time.sleep(0.2)
        return 128 + self.signal if self.signal else code

    def stop_child(self) -> None:
        assert self.child is not None
        self.child.kill()  # before it restarts anyone; the workers follow (PR_SET_PDEATHSIG)
        self.child.wait()

    def close(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def say(message: str, err: bool = False) -> None:
    """A line on the console; none where the terminal is gone (after SIGHUP), as the job goes on."""
    with contextlib.suppress(OSError):
        print(message, file=sys.stderr if err else sys.stdout, flush=True)


@dataclass
class NodeWait:
    """A node's bounded, spoken wait for the others to join the rendezvous."""

    values: dict[str, str]
    done: bool = False
    told: bool = False

    def overdue(self, waited: float) -> bool:
        limit = int(self.values["WAIT_FOR_NODES_S"])
        if not self.told and waited >= min(10.0, limit):
            self.told = True
            print(f"waiting for all of NNODES={self.values['NNODES']} nodes to join at {self.values['MASTER_ADDR']}:"
                  f"{self.values['MASTER_PORT']} (up to WAIT_FOR_NODES_S={limit} s)", flush=True)  # fmt: skip
        return waited >= limit

    def give_up(self) -> str:
        values = self.values
        return (
            f"not all NNODES={values['NNODES']} nodes joined node {values['NODE_RANK']}'s rendezvous at "
            f"{values['MASTER_ADDR']}:{values['MASTER_PORT']} within WAIT_FOR_NODES_S={values['WAIT_FOR_NODES_S']} s: "
            "start the others with the same command and their NODE_RANK, or lower NNODES"
        )


def has_children(pid: int) -> bool:
    """Whether a process has children (Linux: /proc); True where that cannot be told."""
    try:
        return any((task / "children").read_text().strip() for task in Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return True


def own_group_dying_with_parent() -> None:
    """torchrun's setup: a process group of its own, so that Ctrl-C in the terminal reaches it
    once, through this launcher (a second SIGINT during its shutdown would make it SIGTERM the
    workers, which would then stop as if preempted), and death with this launcher."""
    os.setpgid(0, 0)
    die_with_parent()


def die_with_parent() -> None:
    """In a child before it runs: the kernel kills it when this process dies, however it dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def torchrun(launch: Launch, module: str, arguments: list[str], forwarder: Forwarder,
             failed: Callable[[], bool] = lambda: False) -> int:  # fmt: skip
    """torchrun (our agent.py: the same, quieter) on `module` with `arguments`; its exit code."""
    command = [sys.executable, "-m", f"{PACKAGE}.agent", *launch.torchrun_args, "-m", module, *arguments]
    nodes = NodeWait(launch.values) if "--standalone" not in launch.torchrun_args else None
    return forwarder.run(command, {**os.environ, **launch.env}, failed, nodes)


def last_evaluation(run_dir: Path) -> dict | None:
    """The newest validation record of a run's metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    found = None
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("kind") == "val":
            found = record
    return found


def lock_run_dir(run_dir: Path, name: str = ".lock") -> int:
    """Hold `<run dir>/<name>` for the whole job, across torchrun's restarts: a second launch on
    the run dir is refused, naming the holder. The operating system releases the lock when its
    holder dies, however it dies, so a lock is never stale. Returns the open file (keep it)."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / name, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 200).decode(errors="replace").strip() or "another launch"
        os.close(fd)
        raise LaunchError(
            f"run dir {run_dir} is in use by {holder}: wait for that job to end, or give another RUN_DIR"
        ) from None
    since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    os.ftruncate(fd, 0)
    os.write(fd, f"{socket.gethostname()} pid {os.getpid()} since {since}\n".encode())
    return fd


def train(launch: Launch, args: LaunchArgs, run_dir: Path | None, forwarder: Forwarder) -> int:
    """One training job: check, then torchrun; the run dir and the last evaluation at the end."""
    run_dir = preflight(args.overrides, run_dir, launch)
    check_rendezvous(launch)
    if (code := forwarder.stopped_before_start()) is not None:
        return code
    run_dir = run_dir or new_dir()
    node_lock = f".lock.node{launch.values['NODE_RANK']}" if launch.mode == "multi" else ".lock"
    lock = lock_run_dir(run_dir, node_lock)  # each node's run dir: one job at a time
    node = f" (node {launch.values['NODE_RANK']})" if launch.mode == "multi" else ""
    say(f"run dir: {run_dir}{node}")
    in_memory = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # a full disk must not silence the workers
    control = Path(tempfile.mkdtemp(prefix="train_control_", dir=in_memory))
    launch = replace(launch, env={**launch.env, CONTROL_DIR_ENV: str(control)})
    if launch.values.get("DEBUG") == "1":  # the run dir is known only now
        debug_dir = run_dir.resolve() / "debug"
        debug_dir.mkdir(exist_ok=True)
        launch = replace(launch, env={**launch.env, **debug_dir_environment(debug_dir, dict(os.environ))})
    try:
        clear_markers(run_dir, control)
        overrides = [f"hydra.run.dir={quoted(str(run_dir))}", *args.overrides]
        killed_before = oom_kills()
        code = torchrun(launch, f"{PACKAGE}.train", overrides, forwarder,
                        failed=lambda: read_marker(run_dir, FAILED_MARKER, control) is not None)  # fmt: skip
        code = job_exit_code(code, run_dir, control, forwarder)
        if line := oom_line(killed_before, oom_kills()):
            say(f"error: {line}" if code else f"warning: {line} (torchrun restarted them)", err=True)
    finally:
        shutil.rmtree(control, ignore_errors=True)
    say(f"run dir: {run_dir}{node} (logs/, metrics.jsonl, checkpoints/)")
    if (record := last_evaluation(run_dir)) is not None:
        say(f"last evaluation: {json.dumps(record)}")
    os.close(lock)
    return code


def job_exit_code(code: int, run_dir: Path, control: Path, forwarder: Forwarder) -> int:
    """What the job's end means, from the workers' markers rather than torchrun's code alone: an error
    no restart can fix (its line, its code), training finished (0, whatever signal came after), or a
    stop signal after its checkpoint (128 + the signal, also one sent to torchrun rather than here)."""
    if (failed := read_marker(run_dir, FAILED_MARKER, control)) is not None:
        message, _, exit_code = failed.strip().partition("\n")
        message = message or "a worker stopped the job without saying why (its message could not be written)"
        say(f"error: {redact_text(message)} (the traceback: {run_dir}/logs/)", err=True)
        return int(exit_code) if exit_code.strip().isdigit() else 1
    if read_marker(run_dir, FINISHED_MARKER, control) is not None:
        if forwarder.signal:
            say(f"training had finished when {signal.Signals(forwarder.signal).name} came: nothing more to do")
        return 0
    stopped = read_marker(run_dir, STOPPED_MARKER, control)
    if code != 0 and stopped is not None and stopped.strip().isdigit() and not forwarder.signal:
        return 128 + int(stopped)  # a signal sent to torchrun itself
    return code


def quoted(value: str) -> str:
    """A Hydra override value taken literally (a path may hold `=`, `,` or spaces)."""
    return "'" + value.replace("'", "\\'") + "'"


def sweep_points(overrides: list[str]) -> list[list[str]]:
    """Hydra's basic sweep: the cartesian product of every comma list (and range/choice) given."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as error:
        raise LaunchError(describe_composition_error(error)) from None
    axes = []
    for override in parsed:
        key = override.get_key_element()
        if override.is_sweep_override():
            axes.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            axes.append([override.input_line])
    return [list(point) for point in itertools.product(*axes)]


def point_dir_name(index: int, point: list[str], swept: set[str]) -> str:
    label = ",".join(item for item in point if item.split("=", 1)[0].lstrip("+~") in swept)
    return f"{index:03d}_" + re.sub(r"[^A-Za-z0-9._=,+-]", "_", label)[:120]


def run_point(
    launch: Launch, index: int, point: list[str], run_dir: Path, forwarder: Forwarder, **recorded: object
) -> dict:
    """One point of a sweep as its own torchrun job, unless it finished before; its table row
    (with `recorded`, kept in the run dir beside it)."""
    status_file = run_dir / "sweep_point.json"
    previous = json.loads(status_file.read_text()) if status_file.is_file() else {}
    if previous.get("status") == "done":
        print(f"point {index}: {' '.join(point)}: done before, not trained again", flush=True)
        return previous
    print(f"point {index}: {' '.join(point)}", flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    row = {"point": index, "overrides": point, "status": "running", "reason": "", "run_dir": str(run_dir),
           "final": {}, **recorded}  # fmt: skip
    status_file.write_text(json.dumps(row) + "\n")  # an interrupted point keeps its overrides: it resumes
    try:
        code = train(launch, LaunchArgs(overrides=point), run_dir, forwarder)
        reason = "" if code == 0 else f"exit code {code}"
    except LaunchError as error:
        code, reason = USER_ERROR_EXIT, str(error)
        print(f"error: {error}", file=sys.stderr, flush=True)
    status = "done" if code == 0 else ("stopped" if forwarder.signal else "failed")
    row.update(status=status, reason=reason, final=last_evaluation(run_dir) or {})
    status_file.write_text(json.dumps(row) + "\n")
    return row


def sweep(launch: Launch, args: LaunchArgs, forwarder: Forwarder) -> int:
    """Each point of the sweep as its own torchrun job, one after another, in its own run dir of
    one sweep dir; a table of the points and their final figures at the end (results.md)."""
    if "${" in launch.values["SWEEP_DIR"]:
        raise LaunchError(f"SWEEP_DIR={launch.values['SWEEP_DIR']}: a sweep dir holds the runs of several configs, "
                          "so it cannot follow one (${...}): give a plain path")  # fmt: skip
    if Path(launch.values["SWEEP_DIR"]).is_file():
        raise LaunchError(f"SWEEP_DIR={launch.values['SWEEP_DIR']} is a file: give a folder")
    sweep_dir = Path(launch.values["SWEEP_DIR"]) if launch.values["SWEEP_DIR"] else new_dir("sweep_")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    swept = {item.split("=", 1)[0] for item in args.overrides if "," in item or "(" in item}
    if any(item.startswith("hydra/sweeper=optuna") for item in args.overrides):
        rows = optuna_sweep(launch, args.overrides, sweep_dir, forwarder)
    else:
        points = sweep_points(args.overrides)
        print(f"sweep dir: {sweep_dir} ({len(points)} points)", flush=True)
        rows = []
        for index, point in enumerate(points):
            rows.append(run_point(launch, index, point, sweep_dir / point_dir_name(index, point, swept), forwarder))
            if rows[-1]["status"] == "stopped":
                break
    if rows and rows[-1]["status"] == "stopped":
        print(f"sweep stopped by a signal: launch again with SWEEP_DIR={sweep_dir} to continue", flush=True)
        return 128 + forwarder.signal
    table = results_table(rows, swept)
    (sweep_dir / "results.md").write_text(table)
    print(table, end="", flush=True)
    print(f"sweep dir: {sweep_dir} (results.md)", flush=True)
    return 0 if all(row["status"] == "done" for row in rows) else 1


OPTUNA_SETTINGS = {"n_trials": 10, "direction": "minimize", "metric": "val_loss", "seed": 0}


def optuna_sweep(launch: Launch, overrides: list[str], sweep_dir: Path, forwarder: Forwarder) -> list[dict]:
    """`hydra/sweeper=optuna`: Optuna's TPE sampler proposes each trial from the search space
    (`interval(a,b)`, `tag(log,interval(a,b))`, `choice(...)`, `range(...)`, comma lists), and each
    trial is its own torchrun job, as with the basic sweep. `hydra.sweeper.n_trials`, `.direction`,
    `.metric` (a final validation figure, default val_loss) and `.seed` set the study. Launched again
    with SWEEP_DIR, finished trials are told to the study again and an interrupted one resumes."""
    try:
        import optuna
    except ImportError:
        raise LaunchError("hydra/sweeper=optuna needs Optuna: pip install optuna") from None
    settings = dict(OPTUNA_SETTINGS)
    plain = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key.startswith("hydra.sweeper.") and key.split(".", 2)[2].replace("sampler.", "") in settings:
            name = key.split(".", 2)[2].replace("sampler.", "")
            settings[name] = type(OPTUNA_SETTINGS[name])(value)
        elif not key.startswith(("hydra/sweeper", "hydra.sweeper.")):
            plain.append(item)
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(plain)
    except Exception as error:
        raise LaunchError(describe_composition_error(error)) from None
    fixed = [override.input_line for override in parsed if not override.is_sweep_override()]
    space = {override.get_key_element(): distribution(override) for override in parsed if override.is_sweep_override()}
    if not space:
        raise LaunchError("hydra/sweeper=optuna found no search space: give e.g. 'optim.lr=interval(0.01,0.2)'")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction=str(settings["direction"]), sampler=optuna.samplers.TPESampler(seed=int(settings["seed"]))
    )
    print(f"sweep dir: {sweep_dir} (optuna, {settings['n_trials']} trials)", flush=True)
    rows = []
    for index in range(int(settings["n_trials"])):
        run_dir = sweep_dir / f"{index:03d}_trial"
        status_file = run_dir / "sweep_point.json"
        if status_file.is_file():  # this trial's parameters were drawn before: the same again
            study.enqueue_trial(json.loads(status_file.read_text())["params"])
        trial = study.ask(space)
        point = [*fixed, *(f"{key}={value}" for key, value in trial.params.items())]
        row = run_point(launch, index, point, run_dir, forwarder, params=trial.params)
        rows.append(row)
        value = row["final"].get(str(settings["metric"]))
        if row["status"] == "stopped":
            return rows
        if row["status"] == "done" and isinstance(value, int | float):
            study.tell(trial, float(value))
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    done = [row for row in rows if row["status"] == "done" and str(settings["metric"]) in row["final"]]
    if done:
        pick = min if settings["direction"] == "minimize" else max
        best = pick(done, key=lambda row: row["final"][str(settings["metric"])])
        print(f"best trial: {best['point']} ({' '.join(best['overrides'])})", flush=True)
    return rows


def distribution(override: object) -> object:
    """Optuna's distribution for a Hydra sweep override."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    sweep = override.value()  # type: ignore[attr-defined]
    if isinstance(sweep, IntervalSweep):
        log = "log" in sweep.tags
        if isinstance(sweep.start, int) and isinstance(sweep.end, int):
            return IntDistribution(sweep.start, sweep.end, log=log)
        return FloatDistribution(float(sweep.start), float(sweep.end), log=log)  # type: ignore[arg-type]
    if isinstance(sweep, RangeSweep):
        values = list(sweep.range())
        if all(isinstance(value, int) for value in values) and len(values) > 1:
            return IntDistribution(values[0], values[-1], step=values[1] - values[0])
        return CategoricalDistribution(values)
    if isinstance(sweep, ChoiceSweep):
        return CategoricalDistribution([item for item in sweep.list])
    raise LaunchError(f"{override}: not a search space Optuna can sample")


def results_table(rows: list[dict], swept: set[str] | None = None) -> str:
    """The points (their swept overrides) and their final validation figures, as a Markdown table."""
    metrics = sorted({k for row in rows for k in row["final"] if k.startswith("val_")}, key=metric_order)
    header = ["point", "overrides", "status", *metrics]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        figures = [format_figure(row["final"].get(name)) for name in metrics]
        status = row["status"] + (f" ({row['reason']})" if row["status"] == "failed" and row["reason"] else "")
        shown = [item for item in row["overrides"] if swept is None or item.split("=", 1)[0].lstrip("+~") in swept]
        lines.append("| " + " | ".join([str(row["point"]), " ".join(shown), status, *figures]) + " |")
    return "\n".join(lines) + "\n"


def metric_order(name: str) -> tuple[int, str]:
    return ({"val_loss": 0, "val_samples": 2}.get(name, 1), name)


def format_figure(value: object) -> str:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def usage(mode: str) -> str:
    script = {"single": "run_single.sh", "multi": "run_multi.sh", "comm": "check_comm.sh"}[mode]
    keys = [key for key in KEYS if mode in key.modes]
    synopsis = "[KEY=VALUE ...] [Hydra flags and overrides ...] [-- torchrun flags ...]"
    lines = [f"usage: bash scripts/{script} {synopsis}", "",
             "Launch keys (command line, else the environment, else the default):"]  # fmt: skip
    for key in keys:
        default = key.default or "-"
        env = f" [env: {', '.join(key.env)}]" if key.env else ""
        lines.append(f"  {key.name:<19} {default:<6} {key.help}{env}")
    lines += [
        "",
        "Hydra: -m/--multirun (a sweep, single node), --cfg job, --info, --resolve; overrides as below.",
        "torchrun: its flags after --, e.g. -- --log-dir=DIR --local-ranks-filter=0 --redirects=3",
    ]
    return "\n".join(lines)


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
    mode = argv.pop(0) if argv and argv[0] in ("single", "multi", "comm") else "single"
    try:
        args = parse_args(argv, mode)
        if args.help:
            print(usage(mode), flush=True)
            if mode == "comm":
                return 0
            print(flush=True)
            return hydra_only(args)
        if args.hydra_flags and mode != "comm":
            return hydra_only(args)
        if args.multirun and mode != "single":
            raise LaunchError("-m (a sweep) runs on one node: use scripts/run_single.sh -m ...")
        launch = plan(mode, args, dict(os.environ), read_cluster_env(Path("scripts") / "cluster.env"))
        if mode == "comm":
            check_comm_config(args.overrides, launch)
            check_rendezvous(launch)
            return torchrun(launch, f"{PACKAGE}.comm_check", args.overrides, forwarder)
        if args.multirun:
            return sweep(launch, args, forwarder)
        if mode == "multi":
            run_dir = Path("outputs") / launch.values["RUN_NAME"]
        else:
            run_dir = Path(launch.values["RUN_DIR"]) if launch.values["RUN_DIR"] else None
        return train(launch, args, run_dir, forwarder)
    except LaunchError as error:
        fail(str(error))


if __name__ == "__main__":
    sys.exit(main())

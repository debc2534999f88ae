"""The launch keys (KEYS: their defaults, help and environment variables) and the command line: which
arguments are launch keys, Hydra's flags and overrides, or torchrun's; each key's value; usage."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from .modes import extra_modes

USER_ERROR_EXIT = 2
SCRIPTS = {"single": "run_single.sh", "multi": "run_multi.sh"}  # the launcher's own modes (more: launch/modes/)
SWEEP = f"{__package__}.sweep"  # -m on one node, where the project was made with it


class LaunchError(ValueError):
    """A mistake in the launch; reported as one line."""


@dataclass(frozen=True)
class Key:
    name: str
    default: str
    help: str
    env: tuple[str, ...] = ()  # read from the environment when the command line does not give the key
    modes: tuple[str, ...] = ("single", "multi")


KEYS = (
    Key("NPROC_PER_NODE", "", "processes on this machine (default: the visible GPUs; on CPUs 1 in single, else 2)",
        env=("NPROC_PER_NODE", "PET_NPROC_PER_NODE")),
    Key("GPUS", "", "the GPUs to use, e.g. GPUS=0,1,2,3: CUDA_VISIBLE_DEVICES, and one process per listed GPU"),
    Key("MAX_RESTARTS", "3", "times torchrun restarts failed workers; they resume from the newest checkpoint",
        env=("PET_MAX_RESTARTS",)),
    Key("RUN_DIR", "", "the run dir (default: a new outputs/<date>_<time>; many nodes: outputs/RUN_NAME); an "
        "existing one is resumed"),
    Key("NODE_RANK", "", "this node's rank: 0 on the first node, 1, 2, ... on the others",
        env=("NODE_RANK", "PET_NODE_RANK", "GROUP_RANK"), modes=("multi",)),
    Key("NNODES", "2", "N: static, exactly N nodes; MIN:MAX: elastic (c10d rendezvous; nodes may join and leave)",
        env=("NNODES", "PET_NNODES"), modes=("multi",)),
    Key("MASTER_ADDR", "", "node 0's address, reachable from every node (required on nodes other than 0)",
        env=("MASTER_ADDR", "PET_MASTER_ADDR"), modes=("multi",)),
    Key("MASTER_PORT", "29500", "a free port on node 0", env=("MASTER_PORT", "PET_MASTER_PORT"), modes=("multi",)),
    Key("RUN_NAME", "", "the run dir is outputs/RUN_NAME on every node (default: multi_<MASTER_ADDR>_<MASTER_PORT>)",
        modes=("multi",)),
    Key("LOCAL_ADDR", "", "this node's address, where its hostname does not resolve to it", modes=("multi",)),
    Key("WAIT_FOR_MASTER_S", "120", "how long nodes other than 0 wait for node 0's port", modes=("multi",)),
    Key("WAIT_FOR_NODES_S", "600", "how long a node waits for all NNODES (MIN of MIN:MAX) to join before it gives up",
        modes=("multi",)),
    Key("RDZV_LAST_CALL_S", "5", "elastic: how long the rendezvous waits for more nodes once MIN have come",
        modes=("multi",)),
    Key("RDZV_HEARTBEAT_S", "5", "elastic: how often each node tells the rendezvous it lives; one silent for 3 is "
        "dropped and the others go on without it", modes=("multi",)),
    Key("DEBUG", "0", "1: diagnose a hang, into <run dir>/debug/: torch.distributed and NCCL debug logs, NCCL's "
        "flight recorder, and the workers' own debug files (docs/debugging.md)"),
    Key("SHUTDOWN_TIMEOUT_S", "100", "how long torchrun lets workers checkpoint after SIGTERM before it kills them "
        "(Slurm's --signal=TERM@120 leaves 120 s)"),
)  # fmt: skip


@functools.cache  # looked for once per launch
def sweep_module() -> ModuleType | None:
    """launch/sweep.py (-m: its keys and its sweep), where the project was made with it (cookiecutter's sweeps)."""
    return importlib.import_module(SWEEP) if importlib.util.find_spec(SWEEP) is not None else None


def keys_of(mode: str) -> list[Key]:
    """The keys `mode` takes: KEYS' for it (and sweep.py's for single), or a mode's SHARED_KEYS and KEYS."""
    if mode in SCRIPTS:
        sweeps = sweep_module() if mode == "single" else None
        return [key for key in KEYS if mode in key.modes] + list(sweeps.KEYS if sweeps is not None else ())
    module = extra_modes()[mode]
    return [key for key in KEYS if key.name in module.SHARED_KEYS] + list(module.KEYS)


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
    known = [key.name for key in keys_of(mode)]
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
    lines = path.read_text().splitlines() if path.is_file() else []
    matches = (re.fullmatch(r"\s*(?:export\s+)?([A-Z][A-Z0-9_]*)=(.*?)\s*", line) for line in lines)
    return {match.group(1): match.group(2).strip("\"'") for match in matches if match}


def resolve_keys(given: dict[str, str], mode: str, environ: dict[str, str], cluster: dict[str, str]) -> dict[str, str]:
    """Each key's value: the command line, else the environment (a scheduler's), else
    scripts/cluster.env (multi-node defaults of this cluster), else the default."""
    values = {}
    for key in keys_of(mode):
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


def usage(mode: str) -> str:
    script = SCRIPTS[mode] if mode in SCRIPTS else extra_modes()[mode].SCRIPT
    lines = [f"usage: bash scripts/{script} [KEY=VALUE ...] [Hydra flags and overrides ...] [-- torchrun flags ...]",
             "", "Launch keys (command line, else the environment, else the default):"]  # fmt: skip
    for key in keys_of(mode):
        env = f" [env: {', '.join(key.env)}]" if key.env else ""
        lines.append(f"  {key.name:<19} {key.default or '-':<6} {key.help}{env}")
    lines += [
        "",
        "Hydra: "
        + ("-m/--multirun (a sweep, single node), " if sweep_module() is not None else "")
        + "--cfg job, --info, --resolve; overrides as below.",
        "torchrun: its flags after --, e.g. -- --log-dir=DIR --local-ranks-filter=0 --redirects=3",
    ]
    return "\n".join(lines)

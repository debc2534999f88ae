"""A record of every start of a run: `<run dir>/provenance.json`, a list with one record per process
start (a first launch, a torchrun restart, a relaunch on the same run dir), appended by rank 0 before
training starts, so that any result can be traced to the code, software, hardware and command that made it.

A record holds the git commit of the package's source and whether its tree was dirty (the diff against
HEAD of the tracked files, untracked files left out, goes to `provenance/diff_<N>.patch` beside it, N
the record's number); the versions of python, torch, CUDA, NCCL and the project; the CPU, the GPUs, the
world size and nodes; the command line (rank 0's argv, and the launcher's, which it passes on in
common/launch_command.py's LAUNCH_COMMAND_ENV); and the environment variables that change training
(TRAINING_ENV_PREFIXES), never another. Everything goes through common/redaction.py: no token or password in a
URL reaches the file. Checkpoints carry the start's record (`provenance`), and the export writes it beside its
output. Nothing else names this module: engine/assembly/components.py's run_records finds it by its RUN_RECORD.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import platform
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..common.launch_command import LAUNCH_COMMAND_ENV
from ..common.placement import DistEnv
from ..common.redaction import redact
from ..common.run_dir import redact_override

log = logging.getLogger(__name__)

PROVENANCE_FILE = "provenance.json"  # in the run dir: a list of records, one per start
DIFFS_DIR = "provenance"  # diff_<N>.patch: record N's uncommitted changes
# The variables that change how training runs (threads, collectives, devices, kernels); no other is recorded.
TRAINING_ENV_PREFIXES = (
    "OMP_", "MKL_", "KMP_", "NCCL_", "CUDA_", "CUBLAS_", "CUDNN_", "TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "GLOO_",
)  # fmt: skip
TRAINING_ENV_NAMES = ("PYTHONHASHSEED", "NVIDIA_TF32_OVERRIDE")
SOURCE = Path(__file__).resolve().parents[1]  # the package's own folder: the code that runs, wherever the cwd is
GIT_TIMEOUT_S = 30


def git(source: Path, *args: str) -> str | None:
    """git's output in `source`, or None where there is no git or no repository."""
    try:
        done = subprocess.run(
            ["git", "-C", str(source), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(source: Path) -> tuple[dict[str, Any] | None, str]:
    """The commit and dirtiness of the repository holding `source` (None outside one), and its diff."""
    commit = git(source, "rev-parse", "HEAD")
    if commit is None:
        log.info("%s is in no git repository (or git is missing): the run's provenance has no commit", source)
        return None, ""
    diff = git(source, "diff", "HEAD") or ""
    return {"commit": commit.strip(), "dirty": bool(diff), "diff": None}, diff


def project_version(source: Path = SOURCE) -> str | None:
    """The installed package's version, else its pyproject.toml's (a source tree run in place)."""
    try:
        return importlib.metadata.version(source.name)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        text = (source.parent / "pyproject.toml").read_text()
    except OSError:
        return None
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    return match.group(1) if match else None


def versions() -> dict[str, str | None]:
    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
        except (RuntimeError, AttributeError, TypeError):  # a build without NCCL
            nccl = None
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),  # a TorchVersion, which weights_only loading refuses
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "project": project_version(),
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware(world_size: int, local_world_size: int) -> dict[str, Any]:
    gpus = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
    nodes = os.environ.get("GROUP_WORLD_SIZE") or os.environ.get("NNODES") or ""
    return {
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "gpus": gpus,
        "gpu_count": len(gpus),
        "world_size": world_size,
        "local_world_size": local_world_size,
        "nodes": int(nodes) if nodes.isdigit() else max(1, world_size // max(1, local_world_size)),
    }


def training_environment(environ: dict[str, str]) -> dict[str, str]:
    """The variables that change training, redacted; none other."""
    kept = {
        name: value
        for name, value in sorted(environ.items())
        if name.startswith(TRAINING_ENV_PREFIXES) or name in TRAINING_ENV_NAMES
    }
    return redact(kept)


def command(argv: list[str], environ: dict[str, str]) -> dict[str, Any]:
    """Rank 0's command line and the launcher's, each argument redacted as an override is."""
    try:
        launcher = json.loads(environ.get(LAUNCH_COMMAND_ENV) or "null")
    except ValueError:
        launcher = None
    return {
        "argv": [redact_override(item) for item in argv],
        "launcher": [redact_override(str(item)) for item in launcher] if isinstance(launcher, list) else None,
    }


def build_record(
    world_size: int, local_world_size: int, source: Path = SOURCE, environ: dict[str, str] | None = None
) -> tuple[dict[str, Any], str]:
    """This start's record (plain values only) and the diff of its tree."""
    environ = dict(os.environ if environ is None else environ)
    state, diff = git_state(source)
    record = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),  # UTC, as isoformat would write it
        "restart": int(environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),  # torchrun's restarts of this launch
        "git": state,
        "versions": versions(),
        "hardware": hardware(world_size, local_world_size),
        "command": command(list(sys.argv), environ),
        "environment": training_environment(environ),
    }
    return record, diff


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """The run dir's records, oldest first; none where it has no readable file."""
    try:
        records = json.loads((run_dir / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return []
    return records if isinstance(records, list) else []


def write_text_atomically(text: str, path: Path) -> None:
    """Replaced whole or not at all: a kill while writing leaves the last records."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def append_record(run_dir: Path, record: dict[str, Any], diff: str) -> dict[str, Any]:
    """Add `record` (and its diff file, where the tree was dirty) to the run dir's provenance.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    records = read_records(run_dir)
    if (run_dir / PROVENANCE_FILE).exists() and not records:
        log.warning("%s was unreadable: it starts again with this start's record", run_dir / PROVENANCE_FILE)
    record = {"start": len(records) + 1, **record}
    if diff and record["git"] is not None:
        name = f"{DIFFS_DIR}/diff_{record['start']}.patch"
        (run_dir / DIFFS_DIR).mkdir(parents=True, exist_ok=True)
        write_text_atomically(diff, run_dir / name)
        record["git"] = {**record["git"], "diff": name}
    write_text_atomically(json.dumps([*records, record], indent=1) + "\n", run_dir / PROVENANCE_FILE)
    return record


def flat(record: dict[str, Any] | None, prefix: str = "provenance.") -> dict[str, Any]:
    """A record as a tracker's params: dotted keys, plain values (lists joined)."""
    out: dict[str, Any] = {}
    for key, value in (record or {}).items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = " ".join(map(str, value)) if isinstance(value, list) else value
    return out


def summary(record: dict[str, Any] | None) -> str:
    """One line: the commit a checkpoint's run was trained at."""
    if not record:
        return "the checkpoint carries no provenance record (written before runs recorded one)"
    state = record.get("git")
    if not state:
        return "trained outside a git repository (no commit recorded)"
    return f"trained at commit {state['commit']}" + (" with uncommitted changes" if state.get("dirty") else "")


def describe(payload: dict[str, Any]) -> str:
    """summary() of a checkpoint's record: eval's line on the checkpoint it evaluates."""
    return summary(payload.get("provenance"))


def export_record_path(out: Path) -> Path:
    """Where the export's record goes: inside OUT when OUT is a folder, else beside it (OUT.provenance.json)."""
    return out / PROVENANCE_FILE if out.is_dir() else out.with_name(f"{out.name}.{PROVENANCE_FILE}")


def write_export_record(checkpoint: Path, payload: dict[str, Any], out: Path, weights: str) -> Path:
    """The training run's record beside an export: the checkpoint's own (`provenance`), else the last
    of its run dir's provenance.json (a checkpoint from before records lies in <run dir>/checkpoints/)."""
    run = payload.get("provenance") or None
    if run is None and checkpoint.parent.name == "checkpoints":
        run = records[-1] if (records := read_records(checkpoint.parent.parent)) else None
    if run is None:
        log.warning("%s: %s", checkpoint, summary(None))
    record = {"checkpoint": str(checkpoint), "step": payload.get("step"), "weights": weights, "run": run}
    path = export_record_path(out)
    write_text_atomically(json.dumps(record, indent=1) + "\n", path)
    return path


class Provenance:
    """This start's record: written by rank 0 at start, carried by every checkpoint as `provenance`
    (a small dict of plain values; a checkpoint from before it has none)."""

    def __init__(self, record: dict[str, Any] | None = None) -> None:
        self.record = record or {}

    @classmethod
    def start(cls, run_dir: Path, env: DistEnv, source: Path = SOURCE) -> Provenance:
        if not env.is_main:
            return cls()
        record, diff = build_record(env.world_size, env.local_world_size, source)
        try:
            return cls(append_record(run_dir, record, diff))
        except OSError as error:  # a record is no reason to stop a run
            log.warning("could not write %s: %s", run_dir / PROVENANCE_FILE, error)
            return cls(record)

    def params(self) -> dict[str, Any]:
        return flat(self.record)

    def state_dict(self) -> dict[str, Any]:
        return {"provenance": self.record}

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        """Nothing to restore: the record is this start's, the checkpoint's stays in provenance.json."""


RUN_RECORD = Provenance  # started by build.py for each start, found by what is present (components.run_records)

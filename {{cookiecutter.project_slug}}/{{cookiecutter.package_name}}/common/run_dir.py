"""The run dir: one per job, shared by every rank and every restart (docs/pitfalls.md), its files, the
markers the workers leave there for the launcher, and `.hydra/` (written here, redacted)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from .redaction import redact, redact_text
from .registry import modules_with

OUTPUT_ROOT = "outputs"  # where new run dirs go, below the project (or the launch's working dir)
# A run dir's own files and folders (besides what a sink of observe/sinks/ keeps there).
CHECKPOINTS_DIR = "checkpoints"  # step_<N>.pt, step_<N>/, config.yaml
LOGS_DIR = "logs"  # rank_<R>.log, samples_rank_<R>.jsonl
METRICS_FILE = "metrics.jsonl"  # a JSON record per log interval and per evaluation
DEBUG_DIR = "debug"  # DEBUG=1: NCCL's logs and flight recorder, and the workers' own debug files
LOCK_FILE = ".lock"  # held by the launcher for the whole job (.lock.node<N> on many nodes)

# What the workers tell the launcher, as files: the run dir's (for anyone watching the run) and the
# launcher's control dir, CONTROL_DIR_ENV, in memory where it can (/dev/shm): a full disk, or a run dir
# that does not exist yet, must not silence a worker's last word.
STOPPED_MARKER = ".stopped"  # the signal that stopped the job, after its checkpoint
FAILED_MARKER = ".failed"  # the one line of an error no restart can fix; a second line: the exit code
REFUSED = "refused"  # FAILED_MARKER's third line when the workers' start checks refused the job
FINISHED_MARKER = ".finished"  # training ran to its end (a stop signal after that changes nothing)
MARKERS = (STOPPED_MARKER, FAILED_MARKER, FINISHED_MARKER)
CONTROL_DIR_ENV = "TRAIN_CONTROL_DIR"
DEBUG_DIR_ENV = "TRAIN_DEBUG_DIR"  # set by the launcher under DEBUG=1: <run dir>/debug
STORE_ADDRESS_ENV = "TRAIN_STORE_ADDRESS"  # where torchrun's stores listen (agent.py); unset: every interface


def launch_environment(mode: str, argv: list[str]) -> dict[str, str]:
    """The launcher's command (`mode` and its arguments, a JSON list) for the workers, under the name a module
    of this folder reads it by (its LAUNCH_COMMAND_ENV), where one is present."""
    found = modules_with(__package__, [str(Path(__file__).parent)], "LAUNCH_COMMAND_ENV")
    command = json.dumps([mode, *argv])
    return {module.LAUNCH_COMMAND_ENV: command for module in found if hasattr(module, "LAUNCH_COMMAND_ENV")}


def marker_dirs(run_dir: Path | None, control_dir: Path | None = None) -> list[Path]:
    """Where a marker is written and looked for: the launcher's control dir (given, or as the workers
    have it from their environment) first, then the run dir."""
    control = control_dir or os.environ.get(CONTROL_DIR_ENV)
    return [Path(folder) for folder in (control, run_dir) if folder]


def write_marker(run_dir: Path | None, name: str, text: str) -> bool:
    """Write a marker atomically wherever it can; whether any copy was written."""
    written = False
    for folder in marker_dirs(run_dir):
        tmp = folder / f"{name}.{os.getpid()}.tmp"
        try:
            tmp.write_text(text)
            os.replace(tmp, folder / name)
            written = True
        except OSError:  # that disk is full or gone: the other copy says it
            tmp.unlink(missing_ok=True)
    return written


def read_marker(run_dir: Path | None, name: str, control_dir: Path | None = None) -> str | None:
    """A marker's text (its first copy found), or None."""
    for folder in marker_dirs(run_dir, control_dir):
        with contextlib.suppress(OSError):
            return (folder / name).read_text()
    return None


def clear_markers(run_dir: Path | None, control_dir: Path | None = None) -> None:
    """Before a job starts: the markers of the last one go."""
    for folder in marker_dirs(run_dir, control_dir):
        for name in MARKERS:
            (folder / name).unlink(missing_ok=True)


def job_run_dir() -> str:
    """The run dir when none is given (`hydra.run.dir=...`, which the launcher always gives)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":  # the same for all ranks and restarts (--standalone: a uuid per launch)
        return os.path.join(OUTPUT_ROOT, f"torchrun_{run_id}")
    if "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Static rendezvous without an id: nothing job-wide to build a name from.
        return os.path.join(OUTPUT_ROOT, "torchrun_job")
    return os.path.join(OUTPUT_ROOT, time.strftime("%Y-%m-%d_%H-%M-%S"))


def register_resolvers() -> None:
    """The resolver that configs/train.yaml uses under `hydra:`."""
    OmegaConf.register_new_resolver("job_run_dir", job_run_dir, replace=True)


def write_hydra_record(run_dir: Path, cfg: Any, hydra_cfg: Any) -> None:
    """`.hydra/`: the composed config, the overrides and Hydra's own settings, as Hydra would write
    them (configs/train.yaml turns Hydra's writing off), with credentials redacted. Rank 0 only."""
    folder = run_dir / ".hydra"
    folder.mkdir(parents=True, exist_ok=True)
    overrides = [redact_override(item) for item in hydra_cfg.overrides.task]
    hydra = {**OmegaConf.to_container(hydra_cfg, resolve=False), "overrides": {"task": overrides}}  # type: ignore[dict-item]
    records = {
        "config.yaml": redact(OmegaConf.to_container(cfg, resolve=False)),
        "overrides.yaml": overrides,
        "hydra.yaml": {"hydra": redact(hydra)},
    }
    for name, record in records.items():
        (folder / name).write_text(OmegaConf.to_yaml(OmegaConf.create(record)))


def redact_override(item: str) -> str:
    """One command-line override (`key=value`), its secret hidden."""
    key, equals, value = item.partition("=")
    return f"{key}{equals}{redact(value, key)}" if equals else redact_text(item)

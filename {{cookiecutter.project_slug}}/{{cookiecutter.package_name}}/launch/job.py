"""One training job: checked, its run dir made and locked, torchrun started, and its end told from the
workers' markers (docs/launching.md)."""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import itertools
import json
import os
import shutil
import signal
import socket
import tempfile
from dataclasses import replace
from pathlib import Path

from ..common.capacity import oom_kills, oom_line
from ..common.errors import say
from ..common.run_dir import (
    CONTROL_DIR_ENV,
    DEBUG_DIR,
    FAILED_MARKER,
    FINISHED_MARKER,
    LOCK_FILE,
    REFUSED,
    STOPPED_MARKER,
    clear_markers,
    read_marker,
)
from .checks import preflight
from .keys import LaunchArgs, LaunchError
from .plan import Launch, debug_dir_environment
from .rendezvous import check_rendezvous
from .supervise import PACKAGE, Forwarder, torchrun


def train(launch: Launch, args: LaunchArgs, run_dir: Path | None, forwarder: Forwarder) -> int:
    """One training job: check, then torchrun; the run dir and the last evaluation at the end."""
    run_dir = preflight(args.overrides, run_dir, launch)
    check_rendezvous(launch, lambda: forwarder.signal != 0)
    if (code := forwarder.stopped_before_start()) is not None:
        return code
    new = run_dir is None or not run_dir.exists()
    run_dir = run_dir or new_dir()
    node_lock = f"{LOCK_FILE}.node{launch.values['NODE_RANK']}" if launch.mode == "multi" else LOCK_FILE
    lock = lock_run_dir(run_dir, node_lock)  # each node's run dir: one job at a time, freed however it ends
    try:
        node = f" (node {launch.values['NODE_RANK']})" if launch.mode == "multi" else ""
        say(f"run dir: {run_dir}{node}")
        in_memory = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # a full disk must not silence the workers
        control = Path(tempfile.mkdtemp(prefix="train_control_", dir=in_memory))
        env = {**launch.env, CONTROL_DIR_ENV: str(control)}
        if launch.values.get("DEBUG") == "1":  # the run dir is known only now
            (debug_dir := run_dir.resolve() / DEBUG_DIR).mkdir(exist_ok=True)
            env.update(debug_dir_environment(debug_dir, dict(os.environ)))
        launch = replace(launch, env=env)
        try:
            clear_markers(run_dir, control)
            overrides = [f"hydra.run.dir={quoted(str(run_dir))}", *args.overrides]
            killed_before = oom_kills()
            code = torchrun(launch, f"{PACKAGE}.train", overrides, forwarder,
                            failed=lambda: read_marker(run_dir, FAILED_MARKER, control) is not None)  # fmt: skip
            code = job_exit_code(code, run_dir, control, forwarder)
            refused = is_refusal(read_marker(run_dir, FAILED_MARKER, control))
            if line := oom_line(killed_before, oom_kills()):
                say(f"error: {line}" if code else f"warning: {line} (torchrun restarted them)", err=True)
        finally:
            shutil.rmtree(control, ignore_errors=True)
        untouched = all(path.name.startswith(LOCK_FILE) for path in run_dir.iterdir())  # the workers wrote nothing
        stopped_early = bool(forwarder.signal) and (forwarder.before_workers or untouched) and not refused
        if stopped_early:  # a stop signal before torchrun started the workers, or before they wrote anything
            say(f"stopped by {signal.Signals(forwarder.signal).name} before training started: nothing was trained",
                err=True)  # fmt: skip
        if refused or stopped_early:  # a run dir made for the launch goes
            if new and untouched:
                shutil.rmtree(run_dir, ignore_errors=True)
            return code
        say(f"run dir: {run_dir}{node} (logs/, metrics.jsonl, checkpoints/)")
        if (record := last_evaluation(run_dir)) is not None:
            say(f"last evaluation: {json.dumps(record)}")
        return code
    finally:
        os.close(lock)


def job_exit_code(code: int, run_dir: Path, control: Path, forwarder: Forwarder) -> int:
    """What the job's end means, from the workers' markers rather than torchrun's code alone: an error
    no restart can fix (its line, its code), training finished (0, whatever signal came after), or a
    stop signal after its checkpoint (128 + the signal, also one sent to torchrun rather than here)."""
    if (failed := read_marker(run_dir, FAILED_MARKER, control)) is not None:
        message, exit_code, *_ = [*failed.strip().split("\n"), ""]
        message = message or "a worker stopped the job without saying why (its message could not be written)"
        where = "" if is_refusal(failed) else f" (the traceback: {run_dir}/logs/)"
        say(f"error: {message}{where}", err=True)
        return int(exit_code) if exit_code.strip().isdigit() else 1
    if read_marker(run_dir, FINISHED_MARKER, control) is not None:
        if forwarder.signal:
            say(f"training had finished when {signal.Signals(forwarder.signal).name} came: nothing more to do")
        return 0
    stopped = read_marker(run_dir, STOPPED_MARKER, control)
    if code != 0 and stopped is not None and stopped.strip().isdigit() and not forwarder.signal:
        return 128 + int(stopped)  # a signal sent to torchrun itself
    return code


def is_refusal(failed: str | None) -> bool:
    """Whether the workers' FAILED_MARKER is their start's checks refusing the job (engine/assembly/entry.py)."""
    return failed is not None and failed.strip().split("\n")[2:3] == [REFUSED]


def new_dir(prefix: str = "") -> Path:
    """A new dir under outputs/, never one that exists (mkdir is atomic: two jobs started in the
    same second still get different dirs)."""
    base = Path("outputs") / f"{prefix}{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}"
    base.parent.mkdir(parents=True, exist_ok=True)
    for suffix in itertools.count():
        candidate = base.with_name(f"{base.name}_{suffix}" if suffix else base.name)
        with contextlib.suppress(FileExistsError):
            candidate.mkdir()
            return candidate
    raise AssertionError("unreachable")


def lock_run_dir(run_dir: Path, name: str = LOCK_FILE) -> int:
    """Hold `<run dir>/<name>` for the whole job, across torchrun's restarts: a second launch on the run dir
    is refused, naming the holder. The kernel releases the lock when its holder dies, however it dies, so a
    lock is never stale. Returns the open file (keep it)."""
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


def last_evaluation(run_dir: Path) -> dict | None:
    """The newest validation record of a run's metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    found = None
    for line in path.read_text().splitlines() if path.is_file() else []:
        with contextlib.suppress(json.JSONDecodeError):
            if (record := json.loads(line)).get("kind") == "val":
                found = record
    return found


def quoted(value: str) -> str:
    """A Hydra override value taken literally (a path may hold `=`, `,` or spaces)."""
    return "'" + value.replace("'", "\\'") + "'"

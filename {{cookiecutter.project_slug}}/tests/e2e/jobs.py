"""What the e2e tests share: real jobs started (torchrun, the launch scripts, several nodes played on
this machine), watched, interrupted, and read back (metrics, checkpoints, logs). Each e2e test module
imports from here and from ../helpers.py (the config, a command run to its end), never from another."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.engine.checkpoint.files import list_checkpoints, load_checkpoint, shards_reader

from ..helpers import PROJECT_DIR, PYTHON, assert_same, job_env, run

# --- jobs in subprocesses: torchrun, the launch scripts


def torchrun_command(script: str, nproc: int, *args: str, max_restarts: int = 0) -> list[str]:
    """`torchrun --standalone` (a free port, never a fixed one) with nproc CPU processes."""
    return [
        PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}", str(PROJECT_DIR / script), *args,
    ]  # fmt: skip


def torchrun(script: str, nproc: int, *args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return run(torchrun_command(script, nproc, *args), **kwargs)


def project_copy(destination: Path) -> Path:
    """A copy of the project (without run dirs and caches) that a test may add files to."""
    ignored = shutil.ignore_patterns("outputs", ".git", "__pycache__", ".pytest_cache")
    shutil.copytree(PROJECT_DIR, destination, ignore=ignored)
    return destination


def read_metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


# --- one training job through scripts/run_single.sh, watched and interrupted from outside


def start(
    run_dir: Path, nproc: int, *overrides: str, max_restarts: int = 3, cwd: Path = PROJECT_DIR
) -> subprocess.Popen[str]:
    """The launch script, as users start a job, in a session of its own (so the test can signal
    it like a scheduler would): the workers get the environment users' workers get."""
    keys = [f"NPROC_PER_NODE={nproc}", f"MAX_RESTARTS={max_restarts}", f"RUN_DIR={run_dir}"]
    cmd = ["bash", "scripts/run_single.sh", *keys, *overrides]
    return subprocess.Popen(
        cmd, cwd=cwd, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[int, str]:
    """The exit code and the whole output of a job started by start()."""
    output, _ = proc.communicate(timeout=timeout)
    return proc.returncode, output


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


def steps_saved(run_dir: Path) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in list_checkpoints(run_dir / "checkpoints"))


def worker_pid(run_dir: Path, rank: int) -> int:
    """The pid of the newest process of `rank` (each log line carries it)."""
    text = (run_dir / "logs" / f"rank_{rank}.log").read_text()
    return int(re.findall(r"pid=(\d+)\]", text)[-1])


def checkpoint_of(run_dir: Path, step: int) -> Path:
    """The run's checkpoint of `step`: step_<N>.pt (ddp) or the folder of shards step_<N>/."""
    file = run_dir / "checkpoints" / f"step_{step:08d}.pt"
    return file if file.exists() else file.with_suffix("")


def set_aside_after(run_dir: Path, first: int) -> tuple[Path, list[int]]:
    """A killed run as its own reference: its checkpoints after step `first` moved to <run dir>_aside/, so
    that a relaunch resumes from `first` and must save them again bit for bit (assert_bit_identical with the
    aside folder); the aside folder and those steps."""
    aside = run_dir.parent / f"{run_dir.name}_aside"
    (aside / "checkpoints").mkdir(parents=True)
    redone = [step for step in steps_saved(run_dir) if step > first]
    for step in redone:
        path = checkpoint_of(run_dir, step)
        path.rename(aside / "checkpoints" / path.name)
    return aside, redone


def read_checkpoint(path: Path) -> dict:
    """A checkpoint as one dict of whole tensors: a ddp file as saved; a folder of shards
    read whole, its optimizer state keyed by parameter name."""
    payload = load_checkpoint(path)
    if path.is_dir():
        payload = {**payload, **shards_reader(path).read_whole(path)}
    return payload


def assert_bit_identical(run_a: Path, run_b: Path, step: int) -> None:
    """The two runs' checkpoints of `step` hold the same model, optimizer state, position and every rank's
    callbacks' states."""
    a, b = read_checkpoint(checkpoint_of(run_a, step)), read_checkpoint(checkpoint_of(run_b, step))
    assert a["model"].keys() == b["model"].keys()
    for key, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][key]), f"model tensor {key} differs"
    for index, state in a["optimizer"]["state"].items():
        for key, tensor in state.items():
            assert torch.equal(tensor, b["optimizer"]["state"][index][key]), f"optimizer state {index}.{key} differs"
    assert (a["epoch"], a["step"], a["samples_in_epoch"]) == (b["epoch"], b["step"], b["samples_in_epoch"])
    assert_same(a.get("callbacks"), b.get("callbacks"), "the callbacks' states")


def samples_per_epoch(run_dir: Path) -> dict[int, list[int]]:
    """The sample indices each epoch trained on, over every rank (trainer.record_samples=true)."""
    seen: dict[int, list[int]] = {}
    for path in (run_dir / "logs").glob("samples_rank_*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            seen.setdefault(record["epoch"], []).extend(record["indices"])
    return seen


# --- several nodes, played by several run_multi.sh processes on this machine


def node(rank: int, port: int, *args: str, project: Path = PROJECT_DIR, script: str = "run_multi.sh"):
    """One node: a launch script in a session of its own, output captured."""
    cmd = ["bash", str(project / "scripts" / script), f"NODE_RANK={rank}", "MASTER_ADDR=127.0.0.1",
           f"MASTER_PORT={port}", "NPROC_PER_NODE=1", *args]  # fmt: skip
    return subprocess.Popen(cmd, cwd=project, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip


def finish_nodes(*procs: subprocess.Popen[str], timeout: float = 240) -> list[str]:
    """Each node's output, once every node exited 0."""
    outputs = []
    for proc in procs:
        output, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, output[-4000:]
        outputs.append(output)
    return outputs


# --- several nodes on this machine (test_multinode.py, and a strategy's own multi-node test)


def fingerprints(run_dir: Path) -> dict[str, str]:
    """Each rank's last 'weights at step N: sha256 H' line."""
    found = {}
    for path in sorted((run_dir / "logs").glob("rank_*.log")):
        hashes = re.findall(r"weights at step \d+: sha256 (\w+)", path.read_text())
        if hashes:
            found[path.stem] = hashes[-1]
    return found


def wait_for_file(path_glob: str, root: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not list(root.glob(path_glob)):
        assert time.monotonic() < deadline, f"no {path_glob} under {root} after {timeout} s"
        time.sleep(0.2)


def kill_node(proc: subprocess.Popen[str]) -> None:
    """A node dies: its launcher, torchrun and every worker, at once."""
    workers = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()
    agents = [int(pid) for pid in workers]
    children = []
    for agent in agents:
        children += subprocess.run(["pgrep", "-P", str(agent)], capture_output=True, text=True).stdout.split()
    for pid in [*agents, *map(int, children)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=30)

"""What the tests share: the real config composed, real jobs started (torchrun, the launch scripts)
and read back, small data sets written to disk. Test modules import from here, never from
each other."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from {{cookiecutter.package_name}}.checkpoint import list_checkpoints, load_checkpoint
from {{cookiecutter.package_name}}.config import register_configs
from {{cookiecutter.package_name}}.distributed import DistEnv
from {{cookiecutter.package_name}}.launch import worker_environment
from {{cookiecutter.package_name}}.rundir import register_resolvers
from {{cookiecutter.package_name}}.sharded_checkpoint import read_whole

PROJECT_DIR = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

# A small job: a couple of seconds per epoch on two CPU processes (whatever the project's defaults).
SMALL = [
    "task=classification",
    "model=small_cnn",
    "data=synthetic",
    "data.train_size=1024",
    "data.val_size=999",
    "data.batch_size=32",
    "trainer.epochs=2",
    "trainer.log_every_n_steps=4",
]


# --- the config and the process's place in a job, in-process


def compose_config(overrides: list[str] | None = None, name: str = "train", classification: bool = True) -> DictConfig:
    """The config exactly as train.py composes it, with the given overrides (and, unless they name
    a task or `classification` is off, task=classification: what the image tests assume)."""
    register_configs()
    register_resolvers()
    overrides = list(overrides or [])
    if classification and not any(item.startswith("task=") for item in overrides):
        overrides.insert(0, "task=classification")
    with initialize_config_dir(config_dir=str(PROJECT_DIR / "configs"), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def cpu_env(rank: int, world_size: int) -> DistEnv:
    """What a process of a CPU job of `world_size` ranks (one node) sees; no process group needed."""
    return DistEnv(rank, rank, world_size, world_size, "gloo", torch.device("cpu"))


def on_ranks(world_size: int, function: Callable[..., object], *args: object, timeout: float = 120) -> list:
    """`function(env, *args)` on `world_size` processes joined by a real gloo group, as a torchrun
    job's workers are, with no port (a FileStore in a temporary file). `function` must be importable
    (a module-level function of a test module). The processes fork from a server that imported torch
    and the package once per test session, so a call costs no interpreter start-up. Each rank's
    return value, in rank order; a rank's exception fails the test with its traceback."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "{{cookiecutter.package_name}}.trainer", "tests.helpers"])
    results = context.SimpleQueue()
    store_fd, store_file = tempfile.mkstemp(prefix="store_")
    os.close(store_fd)
    processes = [
        context.Process(target=_rank_main, args=(rank, world_size, store_file, results, function, args), daemon=True)
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    outcome: dict[int, tuple[bool, bytes | str]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(outcome) < world_size:
            if time.monotonic() > deadline:
                pytest.fail(f"ranks {sorted(set(range(world_size)) - set(outcome))} did not finish in {timeout} s")
            if results.empty():
                time.sleep(0.01)
                continue
            rank, ok, value, hits = results.get()
            outcome[rank] = (ok, value)
            record_mutation_hits(hits)
            if not ok:  # the others may wait on it in a collective: no need to wait for them
                break
    finally:
        for process in processes:
            process.kill()
            process.join()
        os.unlink(store_file)
    for rank in sorted(outcome):
        ok, value = outcome[rank]
        if not ok:
            pytest.fail(f"rank {rank} failed:\n{value}")
    return [pickle.loads(outcome[rank][1]) for rank in range(world_size)]  # type: ignore[arg-type]


def _rank_main(rank: int, world_size: int, store_file: str, results, function, args) -> None:  # noqa: ANN001
    torch.set_num_threads(1)  # as the launcher's OMP_NUM_THREADS=1: the ranks share the cores
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size))  # fmt: skip
    try:
        store = torch.distributed.FileStore(store_file, world_size)
        torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
        value = function(cpu_env(rank, world_size), *args)
        torch.distributed.barrier()
        # Pickled here by value: the queue's own pickler would share tensors through this process, which exits now.
        results.put((rank, True, pickle.dumps(value), mutation_hits()))
    except BaseException:
        results.put((rank, False, traceback.format_exc(), mutation_hits()))
    finally:
        os._exit(0)  # nothing of the parent's teardown in a forked child


def mutation_hits() -> set[str]:
    """Under mutation testing (mutmut, docs/layout.md): the package's functions this process ran."""
    return set(sys.modules["mutmut.state"].state()._stats) if "mutmut.state" in sys.modules else set()


def record_mutation_hits(hits: set[str]) -> None:
    """Count the functions a rank ran as run by the test, so that mutmut runs it against their mutants."""
    if hits and "mutmut.state" in sys.modules:
        sys.modules["mutmut.state"].state()._stats.update(hits)


# --- small data sets on disk, in the formats the project reads


def write_image_tree(root: Path, classes: int, per_class: int) -> None:
    """root/{train,val}/class_<k>/<i>.png: an image_folder data set of 20x24 random images."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label in range(classes):
            folder = root / split / f"class_{label}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")


def write_cifar(root: Path, per_file: int) -> None:
    """CIFAR-10's own pickled batches (5 training files and a test file), `per_file` images each."""
    import pickle

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            "data": rng.integers(0, 255, (per_file, 3072), dtype=np.uint8),
            "labels": [int(label) for label in rng.integers(0, 10, per_file)],
        }
        with open(folder / name, "wb") as file:
            pickle.dump(batch, file)


# --- jobs in subprocesses: torchrun, the launch scripts


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for launched jobs: what the launcher sets for users' workers (so jobs the
    tests start with torchrun directly get the same), unbuffered output."""
    return {**os.environ, **worker_environment(dict(os.environ)), "PYTHONUNBUFFERED": "1", "PYTHON": PYTHON,
            **(extra or {})}  # fmt: skip


def run(
    cmd: list[str],
    cwd: Path = PROJECT_DIR,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    expect_ok: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on an unexpected exit code fail with the end of its output."""
    proc = subprocess.run(cmd, cwd=cwd, env=job_env(env), capture_output=True, text=True, timeout=timeout)
    if expect_ok and proc.returncode != 0:
        output = f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n{output}")
    return proc


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
    """The run's checkpoint of `step`: step_<N>.pt (ddp) or the folder step_<N>/ (fsdp)."""
    file = run_dir / "checkpoints" / f"step_{step:08d}.pt"
    return file if file.exists() else file.with_suffix("")


def read_checkpoint(path: Path) -> dict:
    """A checkpoint as one dict of whole tensors: a ddp file as saved; a folder of shards (fsdp)
    read whole, its optimizer state keyed by parameter name."""
    payload = load_checkpoint(path)
    if path.is_dir():
        payload = {**payload, **read_whole(path)}
    return payload


def assert_bit_identical(run_a: Path, run_b: Path, step: int) -> None:
    """The two runs' checkpoints of `step` hold the same model, optimizer state and position."""
    a, b = read_checkpoint(checkpoint_of(run_a, step)), read_checkpoint(checkpoint_of(run_b, step))
    assert a["model"].keys() == b["model"].keys()
    for key, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][key]), f"model tensor {key} differs"
    for index, state in a["optimizer"]["state"].items():
        for key, tensor in state.items():
            assert torch.equal(tensor, b["optimizer"]["state"][index][key]), f"optimizer state {index}.{key} differs"
    assert (a["epoch"], a["step"], a["samples_in_epoch"]) == (b["epoch"], b["step"], b["samples_in_epoch"])


def samples_per_epoch(run_dir: Path) -> dict[int, list[int]]:
    """The sample indices each epoch trained on, over every rank (trainer.record_samples=true)."""
    seen: dict[int, list[int]] = {}
    for path in (run_dir / "logs").glob("samples_rank_*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            seen.setdefault(record["epoch"], []).extend(record["indices"])
    return seen


# --- several nodes, played by several run_multi.sh processes on this machine


def free_port() -> int:
    """A port the OS reports free now (tests never use fixed ports)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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

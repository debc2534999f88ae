"""What the unit tests share, in-process: the real config composed, a function run on several ranks,
small data sets written to disk, and what the tests of neighbouring modules both build (a trainer, a
checkpoint writer, a launch plan). Test modules import from here, never from each other; the e2e
tests' job helpers (torchrun, the launch scripts, reading a run back) are in e2e/jobs.py."""

from __future__ import annotations

import copy
import functools
import json
import multiprocessing
import os
import pickle
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
from omegaconf import DictConfig, OmegaConf
from torch import nn

from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.common.run_dir import CONTROL_DIR_ENV, FINISHED_MARKER, register_resolvers
from {{cookiecutter.package_name}}.config import CheckpointConfig, DataConfig, register_configs, to_train_config
from {{cookiecutter.package_name}}.datasets import pad_sequences
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.engine.checkpoint.writer import Checkpointer
from {{cookiecutter.package_name}}.engine.preemption import StopOnSigterm
from {{cookiecutter.package_name}}.engine.strategies import Strategy, names, strategy_class
from {{cookiecutter.package_name}}.engine.trainer import Trainer
from {{cookiecutter.package_name}}.launch.keys import parse_args
from {{cookiecutter.package_name}}.launch.plan import plan, worker_environment
from {{cookiecutter.package_name}}.observe.sinks import sink_modules

PROJECT_DIR = Path(__file__).resolve().parents[1]
# The model configs this project has, as Hydra lists them when one named is not there.
MODEL_CHOICES = ", ".join(sorted(path.stem for path in (PROJECT_DIR / "configs" / "model").glob("*.yaml")))
PYTHON = sys.executable
# The strategies a test that runs "each strategy" takes: each one the project has that is not another on a
# different mesh (a subclass: its own tests cover what differs).
STRATEGIES = [name for name in names() if strategy_class(name).__bases__ == (Strategy,)]
WIDEST = STRATEGIES[-1]  # the one whose paths reach furthest: a sharding strategy where the project has one, else ddp


def sinks_on_by_default() -> list[str]:
    """The sinks this project has (observe/sinks/) that configs/train.yaml's `log` section switches on."""
    log = OmegaConf.load(PROJECT_DIR / "configs" / "train.yaml")["log"]
    names = [module.__name__.rsplit(".", 1)[-1] for module in sink_modules()]
    return [name for name in names if log.get(name) is True]


# The sinks on by default, off in the tests' jobs: a sink's import cost rank 0 0.2-0.4 CPU-s in every job and
# every restart. Each sink's own tests switch it on (tests/observe/sinks/, tests/e2e/).
SINKS_OFF = [f"log.{name}=false" for name in sinks_on_by_default()]

# A small job: a couple of seconds per epoch on two CPU processes (whatever the project's defaults).
SMALL = [
    "task=classification",
    "model=small_cnn",
    "data=synthetic",
    "data.train_size=1024",
    "data.val_size=251",  # odd, and not a multiple of 3 or of the batch: evaluation pads at every world size
    "data.batch_size=32",
    "data.image_size=16",  # a quarter of 32x32's convolutions: a job is mostly its start, not its steps
    "trainer.epochs=2",
    "trainer.log_every_n_steps=4",
    *SINKS_OFF,
]


# --- the config and the process's place in a job, in-process


def compose_config(overrides: list[str] | None = None, name: str = "train", classification: bool = True) -> DictConfig:
    """The config exactly as train.py composes it, with the given overrides (and, unless they name
    a task or `classification` is off, task=classification: what the image tests assume). Each call
    gets a copy of its own; Hydra composes each list of overrides once a test process (0.2 s a compose,
    some hundreds of the quick tests' calls alike: a good part of their time)."""
    register_configs()
    register_resolvers()
    overrides = list(overrides or [])
    if classification and not any(item.startswith("task=") for item in overrides):
        overrides.insert(0, "task=classification")
    return copy.deepcopy(composed(tuple(overrides), name))


@functools.cache
def composed(overrides: tuple[str, ...], name: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(PROJECT_DIR / "configs"), version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


def cpu_env(rank: int, world_size: int) -> DistEnv:
    """What a process of a CPU job of `world_size` ranks (one node) sees; no process group needed."""
    return DistEnv(rank, rank, world_size, world_size, "gloo", torch.device("cpu"))


def check_launch_for(overrides: list[str], run_dir: Path | None = None, nproc: int = 1, gpus: int = 0):  # noqa: ANN201
    """What a worker checks as it starts (engine/assembly/checks.py), for a job of `nproc` processes on a node
    with `gpus` GPUs; the model it built."""
    from {{cookiecutter.package_name}}.common.placement import choose_backend
    from {{cookiecutter.package_name}}.config import to_train_config
    from {{cookiecutter.package_name}}.engine.assembly.checks import check_launch

    config = to_train_config(compose_config(overrides))
    choice = choose_backend(config.dist.backend, gpus, nproc, mpi_available=False)
    return check_launch(config, run_dir, DistEnv(0, 0, nproc, nproc, choice.backend, torch.device("cpu")), choice)


def on_ranks(world_size: int, function: Callable[..., object], *args: object, timeout: float = 120) -> list:
    """`function(env, *args)` on `world_size` processes joined by a real gloo group, as a torchrun
    job's workers are, with no port (a FileStore in a temporary file). `function` must be importable
    (a module-level function of a test module). The processes fork from a server that imported torch
    and the package once per test session, so a call costs no interpreter start-up. Each rank's
    return value, in rank order; a rank's exception fails the test with its traceback, a rank that ends
    without a result fails it at once. Never forked from the test's own process: after earlier tests left
    threads running there (gloo's, torch's), a forked rank can crash (a segfault in a 4-rank test seen
    under mutation testing, where a mutant's process starts a server of its own)."""
    context = multiprocessing.get_context("forkserver")
    # torch._dynamo: every optimizer's construction imports it (0.9 s a rank, a third of many tests' time)
    context.set_forkserver_preload(["torch", "torch._dynamo", "{{cookiecutter.package_name}}.engine.trainer", "tests.helpers"])
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
                ended = [rank for rank, process in enumerate(processes) if process.exitcode is not None]
                ended = [rank for rank in ended if rank not in outcome]
                if ended and results.empty():  # what a rank sends is in the pipe before it exits
                    pytest.fail(f"rank {ended[0]} ended (exit code {processes[ended[0]].exitcode}) without a result")
                time.sleep(0.01)
                continue
            rank, ok, value, hits = results.get()
            outcome[rank] = (ok, value)
            record_mutation_hits(hits)
            if not ok:  # the others may wait on it in a collective: no need to wait for them
                break
    finally:
        if not all(ok for ok, _ in outcome.values()):  # how the others end: a peer that crashed says why here
            given = time.monotonic() + 2
            for process in processes:
                process.join(timeout=max(0.0, given - time.monotonic()))
        others = {rank: process.exitcode for rank, process in enumerate(processes) if rank not in outcome}
        for process in processes:
            process.kill()
            process.join()
        os.unlink(store_file)
    for rank in sorted(outcome):
        ok, value = outcome[rank]
        if not ok:
            ended = ", ".join(f"rank {other}: {'running' if code is None else f'exit code {code}'}"
                              for other, code in others.items())  # fmt: skip
            pytest.fail(f"rank {rank} failed{f' (then {ended})' if ended else ''}:\n{value}")
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


def write_image_tree(
    root: Path, classes: int, per_class: int, val_per_class: int | None = None, size: tuple[int, int] = (20, 24)
) -> Path:
    """root/{train,val}/class_<k>/<i>.png: an image_folder data set of random images (height, width = size)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("val", per_class if val_per_class is None else val_per_class)):
        for label in range(classes):
            folder = root / split / f"class_{label}"
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 255, (*size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


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


# --- a port for a server of a test's own


def free_port() -> int:
    """A port the OS reports free now (tests never use fixed ports)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- a command run to its end (the jobs themselves, started and watched: e2e/jobs.py)


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


# --- a trainer in this process, a world of one with no process group (engine/test_trainer.py,
# engine/checkpoint/test_manager.py, engine/strategies/test_ddp.py)

CPU = DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, backend="gloo", device=torch.device("cpu"))
# In-process runs keep 32x32 images: their recorded losses and figures were made at that size.
TINY = [*SMALL, "data.image_size=32", "data.train_size=96", "data.val_size=16"]


def trainer(run_dir: Path, *overrides: str) -> Trainer:
    return build_trainer(to_train_config(compose_config([*TINY, *overrides])), CPU, run_dir)


def assert_same(a: object, b: object, where: str = "state") -> None:
    """Equal nested states: tensors bit for bit, everything else by ==."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{index}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


# --- the checkpoint writer alone (engine/checkpoint/test_files.py, test_writer.py)


def checkpointer(folder: Path, keep_last: int, resume: str = "auto") -> Checkpointer:
    config = CheckpointConfig(every_n_steps=1, keep_last=keep_last, resume=resume, allow_changes=[])
    return Checkpointer(folder, config, is_writer=True)


# --- the launcher in this process (launch/test_*.py)


def planned(mode: str, *argv: str, environ: dict[str, str] | None = None, cluster: dict[str, str] | None = None):
    args = parse_args(list(argv), mode)
    return plan(mode, args, {"CUDA_VISIBLE_DEVICES": "", **(environ or {})}, cluster or {})


TINY_JOB = ["task=classification", "data=synthetic", "model=small_cnn", "data.train_size=64", "data.val_size=16"]


def quick_jobs(calls: list[list[str]], code: int = 0):
    """torchrun's stand-in: a job (a sweep's point) ends at once, leaving what a finished one leaves (its final
    validation, val_loss = its learning rate; the finished marker), or exiting `code`."""

    def torchrun(launch, module, arguments, forwarder, failed=None) -> int:
        run_dir = Path(arguments[0].split("=", 1)[1].strip("'"))
        calls.append(arguments[1:])
        lr = float(next((item.split("=")[1] for item in arguments if item.startswith("optim.lr=")), "0.1"))
        record = {"kind": "val", "step": 2, "epoch": 0, "val_loss": lr, "val_acc": 0.5, "val_samples": 16}
        (run_dir / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        if code == 0:
            (Path(launch.env[CONTROL_DIR_ENV]) / FINISHED_MARKER).write_text("2\n")
        return code

    return torchrun


# --- items that do not stack: sequences of several lengths batched by a data.collate (engine/test_data.py,
# test_evaluate.py, test_checks.py)


def sequences(train_size: int = 9, val_size: int = 5) -> tuple[list, list]:
    """(train, val) of (tokens, class) items: item i holds i % 4 + 1 tokens counting up from i, class i % 3."""

    def items(count: int, first: int) -> list[tuple[torch.Tensor, int]]:
        return [(torch.arange(first + i, first + i + i % 4 + 1), (first + i) % 3) for i in range(count)]

    return items(train_size, 0), items(val_size, 50)


def sequence_data(**keys: object) -> DataConfig:
    """The data node of `sequences` in batches of 4, padded with 63 by pad_sequences; `keys` replace or add keys."""
    collate = {"_target_": f"{pad_sequences.__module__}.pad_sequences", "pad_value": 63}
    node = {"batch_size": 4, "dataset": {"_target_": f"{__name__}.sequences"}, "collate": collate, **keys}
    return DataConfig.from_node(node)


class BagOfTokens(nn.Module):
    """A model for pad_sequences' batches: the mean embedding of a sequence's real tokens, then 3 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.bag, self.head = nn.EmbeddingBag(64, 8, mode="sum"), nn.Linear(8, 3)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        real = (torch.arange(tokens.shape[1]) < lengths[:, None]).float()
        return self.head(self.bag(tokens, per_sample_weights=real / lengths[:, None]))


def record_fsyncs() -> list[str]:
    """From now on in this process, the path of every file and folder os.fsync is given, in order (a SIGKILL
    keeps the page cache, so only a record of the calls shows that what must reach the disk is sent there)."""
    import os

    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    os.fsync = fsync  # type: ignore[assignment]
    return synced


def train_one_epoch(trained: Trainer) -> None:
    """One epoch of `trained` as the loop runs it (stop signals watched), its checkpoints on disk."""
    stop = StopOnSigterm()
    try:
        trained.train_epoch(stop)
    finally:
        stop.close()
    trained.checkpoints.wait()


def train_stop_resume(
    env: DistEnv,
    run_dir: Path,
    overrides: list[str],
    extra: Callable[[Trainer], object] | None = None,
    before: Callable[[Trainer], object] | None = None,
) -> dict:
    """One epoch of 6 steps with a checkpoint at step 4, then a second trainer (a restarted job)
    that resumes from it and trains steps 5 and 6 (for on_ranks): both ends' weights (rank 0's), this
    rank's buffers and step, and `extra` of each trainer after its epoch and `before` of it before
    any step (module-level functions) where given."""
    config = to_train_config(compose_config([*TINY, "data.train_size=96", "data.batch_size=8",
                                             "checkpoint.every_n_steps=4", *overrides]))  # fmt: skip
    ends = {}
    for name in ("uninterrupted", "resumed"):
        trained = build_trainer(config, env, run_dir)
        if before is not None:
            ends[f"{name}_before"] = before(trained)
        train_one_epoch(trained)
        ends[name] = {key: tensor.clone() for key, tensor in trained.strategy.full_weights().items()}  # rank 0's
        ends[f"{name}_step"] = trained.state.step
        ends[f"{name}_buffers"] = {key: buffer.clone() for key, buffer in trained.model.named_buffers()}
        if extra is not None:
            ends[f"{name}_extra"] = extra(trained)
    return ends


def forbid_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if torchrun's agent (launch/supervise.py starts it) is started; other processes run."""
    real_popen = subprocess.Popen

    def no_torchrun(command, *args, **kwargs):
        assert not any(str(part).endswith(".agent") for part in command), "torchrun started"
        return real_popen(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", no_torchrun)

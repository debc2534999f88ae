"""Checkpoints and exact resume, tested the hard way: real torchrun jobs killed from outside."""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.engine.checkpoint.files import list_checkpoints, load_checkpoint

from ..helpers import PROJECT_DIR, SMALL, run
from .jobs import (
    assert_bit_identical,
    finish,
    read_metrics,
    start,
    steps_saved,
    wait_for,
    worker_pid,
)

pytestmark = pytest.mark.slow

# The modules beside this file that check what a diverged run leaves (check_diverged_run(run_dir, step, cause,
# line)): each a capability's own, which a project made without it lacks.
DIVERGED_CHECKS = [
    importlib.import_module(f"{__package__}.{path.stem}")
    for path in sorted(Path(__file__).parent.glob("*.py"))
    if re.search(r"^def check_diverged_run\(", path.read_text(), re.MULTILINE)
]

# 3 epochs of 16 steps on 2 processes, a checkpoint every 5 steps, augmentation on, SMALL's 16x16 images: about
# 0.04 s a step.
JOB = [*SMALL, "trainer.epochs=3", "checkpoint.every_n_steps=5", "checkpoint.keep_last=20", "data.augment=true"]
LAST_STEP = 48


def starts_logged(run_dir: Path) -> int:
    path = run_dir / "logs" / "rank_0.log"
    return path.read_text().count("run dir:") if path.exists() else 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run every interrupted one must match bit for bit."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    code, output = finish(start(run_dir, 2, *JOB))
    assert code == 0, output[-3000:]
    assert steps_saved(run_dir)[-1] == LAST_STEP
    return run_dir


def test_checkpoints_are_plain_and_load_with_weights_only(reference: Path) -> None:
    assert steps_saved(reference) == [5, 10, 15, 16, 20, 25, 30, 32, 35, 40, 45, 48]
    path = reference / "checkpoints" / f"step_{LAST_STEP:08d}.pt"
    payload = torch.load(path, map_location="cpu", weights_only=True)
    assert {"format_version", "model", "optimizer", "epoch", "step", "samples_in_epoch", "config"} <= payload.keys()
    assert payload["step"] == LAST_STEP and payload["epoch"] == 3 and payload["samples_in_epoch"] == 0
    assert isinstance(payload["config"], dict) and payload["config"]["model"]["_target_"].endswith(".SmallCNN")
    assert (reference / "checkpoints" / "config.yaml").read_text().startswith("seed: 0")


def test_on_device_data_killed_several_times_still_ends_bit_identical_to_the_loader_path(
    reference: Path, tmp_path: Path
) -> None:
    """Two promises on one run (it was two runs of the whole job): the data on the device trains as the
    DataLoader does, and three kills of a worker each resume bit-exactly."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, 2, *JOB, "data.on_device=true", max_restarts=5)
    for kill_at, rank in ((5, 0), (20, 1), (35, 0)):
        wait_for(lambda step=kill_at: step in steps_saved(run_dir), f"the checkpoint of step {kill_at}")
        os.kill(worker_pid(run_dir, rank), signal.SIGKILL)
    code, output = finish(proc)
    assert code == 0, output[-3000:]
    assert starts_logged(run_dir) == 4, "torchrun must have restarted the workers three times"
    assert re.search(r"resumed from .*step_000000(05|10)\.pt", output)
    assert_bit_identical(reference, run_dir, step=LAST_STEP)


def test_kill_during_a_checkpoint_write_keeps_every_checkpoint_whole(tmp_path: Path) -> None:
    # resnet18: a 90 MB checkpoint takes long enough to write that the kill lands inside the write.
    job = [
        "model=resnet18",
        "data=synthetic",  # whatever the project's default data set
        "data.image_size=16",  # the checkpoint is as large, the steps between its writes shorter
        "data.train_size=64",
        "data.val_size=16",
        "data.batch_size=4",
        "trainer.epochs=1",
        "checkpoint.every_n_steps=1",
        "checkpoint.keep_last=20",
    ]
    run_dir = tmp_path / "run"  # the weights it ends with: bit-exact resumes are tested above
    proc = start(run_dir, 2, *job)
    folder = run_dir / "checkpoints"
    wait_for(
        lambda: 3 in steps_saved(run_dir) and any(p.name.startswith(".tmp_") for p in folder.iterdir()),
        "a checkpoint being written",
    )
    os.kill(worker_pid(run_dir, 0), signal.SIGKILL)  # rank 0 is the writer
    time.sleep(0.05)
    for path in list_checkpoints(folder):  # never a partial file under a checkpoint's name
        load_checkpoint(path)
    code, output = finish(proc)
    assert code == 0, output[-3000:]
    assert not any(p.name.startswith(".tmp_") for p in folder.iterdir())
    resumed = int(re.findall(r"resumed from \S*step_(\d+)\.pt", output)[0])
    assert resumed >= 3 and steps_saved(run_dir)[-1] == 8, (resumed, steps_saved(run_dir))


# A process that imports torch once and forks a writer for each folder the test names (torch's import, 1.5 CPU-s,
# once, not once a kill): the writer saves checkpoints in a loop until the test SIGKILLs it.
WRITERS = """
import os, sys, torch
from pathlib import Path
from {{cookiecutter.package_name}}.engine.checkpoint.files import write_atomically, checkpoint_name
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        state = {"model": {"w": torch.randn(4_000_000)}, "step": 0}
        for step in range(1, 10_000):
            state["step"] = step
            write_atomically(state, Path(line.strip()) / checkpoint_name(step))
        os._exit(0)
    print(pid, flush=True)
    print(os.waitpid(pid, 0)[1], flush=True)
"""


def test_atomic_write_survives_sigkill_at_random_moments(tmp_path: Path) -> None:
    writers = subprocess.Popen([sys.executable, "-c", WRITERS], cwd=PROJECT_DIR, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert writers.stdin is not None and writers.stdout is not None
    try:
        for attempt in range(6):
            folder = tmp_path / str(attempt)
            folder.mkdir()
            writers.stdin.write(f"{folder}\n")
            writers.stdin.flush()
            pid = int(writers.stdout.readline())
            wait_for(lambda folder=folder: len(list(folder.iterdir())) >= 2, "two files")
            time.sleep(0.013 * attempt)
            os.kill(pid, signal.SIGKILL)
            assert int(writers.stdout.readline()) == signal.SIGKILL, "killed while writing, not ended"
            names = list_checkpoints(folder)
            assert names, "at least the first checkpoint must be complete"
            for path in names:
                assert load_checkpoint(path)["model"]["w"].numel() == 4_000_000
    finally:
        writers.kill()
        writers.communicate()


# A relaunch whose overrides its checkpoint cannot take (another model width, data set, a finished run), refused
# in one line before torchrun, the checkpoints untouched: tests/engine/assembly/test_checks.py and
# tests/config/test_compatibility.py, in-process; the pre-flight check's refusals through the launch script,
# exit 2: test_launch.py.


def test_resume_from_a_path_and_never_over_existing_checkpoints(reference: Path, tmp_path: Path) -> None:
    source = reference / "checkpoints" / "step_00000040.pt"
    run_dir = tmp_path / "from_path"
    proc = run(
        ["bash", "scripts/run_single.sh", f"RUN_DIR={run_dir}", "NPROC_PER_NODE=2", *JOB, f"checkpoint.resume={source}"]
    )
    assert f"resumed from {source}" in proc.stderr
    assert_bit_identical(reference, run_dir, step=LAST_STEP)
    # checkpoint.resume=never over a run's checkpoints, and a path that is not there, refused in one line
    # before any work: tests/engine/checkpoint/test_writer.py, tests/engine/assembly/test_checks.py.


def torchrun_agent(launcher_pid: int) -> int:
    found = subprocess.run(["pgrep", "-P", str(launcher_pid), "-f", r"\.agent "], capture_output=True,
                           text=True).stdout.split()  # fmt: skip
    assert len(found) == 1, found
    return int(found[0])


def listening_addresses(session: int) -> set[str]:
    """The addresses the processes of a session (a launch and everything it started) listen on."""
    inodes = set()
    for pid in subprocess.run(["pgrep", "-s", str(session)], capture_output=True, text=True).stdout.split():
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            with contextlib.suppress(OSError):
                if (target := os.readlink(fd)).startswith("socket:["):
                    inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                raw = bytes.fromhex(fields[1].split(":")[0])  # each 32-bit word is little-endian
                found.add(str(ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"  # a zombie is gone


def newest_record(run_dir: Path) -> int:
    """The highest step metrics.jsonl holds (0 before any), read while a job may be writing it."""
    try:
        return max((record["step"] for record in read_metrics(run_dir)), default=0)
    except (FileNotFoundError, ValueError):  # not there yet, or a line half written
        return 0


# Ctrl-C to the whole group; SIGTERM to the whole group (a scheduler's), and to torchrun itself (what some
# schedulers signal); SIGKILL of the launch script, which the kernel passes on to torchrun and from it to the
# workers (PR_SET_PDEATHSIG): SIGKILL of torchrun itself is that chain's second link. A hangup (a closed terminal)
# takes the group signal's path: the launcher forwards it (tests/launch/test_supervise.py), the ranks agree on it
# (tests/engine/test_preemption.py), exit code 129 (tests/launch/test_job.py). Resumed on other world sizes, each
# sample once: tests/config/test_batches.py in-process, and through torchrun the elastic and recipe jobs
# (test_multinode.py, test_recipe.py: "saved by 2 processes, now 1").
STOPS = [("group", signal.SIGINT, 130), ("group", signal.SIGTERM, 143), ("agent", signal.SIGTERM, 143),
         ("launcher", signal.SIGKILL, None)]  # fmt: skip


def test_one_run_stopped_by_each_signal_and_kill_resumes_each_time_and_ends_bit_identical(
    reference: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    for target, signum, code in STOPS:
        before = newest_record(run_dir)  # a kill leaves records past its checkpoint: wait for this launch's own
        proc = start(run_dir, 2, *JOB)
        wait_for(lambda before=before: newest_record(run_dir) > before, f"a step past {before}")
        if signum == signal.SIGINT:  # while it runs: a job on one node listens on loopback alone
            assert listening_addresses(proc.pid) <= {"127.0.0.1", "::1"}, listening_addresses(proc.pid)
        workers = [worker_pid(run_dir, rank) for rank in (0, 1)]
        pid = {"group": -proc.pid, "agent": torchrun_agent(proc.pid), "launcher": proc.pid}[target]
        os.kill(pid, signum)  # a negative pid: the whole group, as a terminal signals its foreground job
        killed_at = time.monotonic()
        if signum == signal.SIGKILL:  # the workers die with their agent, and nothing is written after
            wait_for(lambda w=workers: not any(map(alive, w)), "the workers to die with their agent", timeout=15)
            assert time.monotonic() - killed_at < 15
            finish(proc)
            steps_after = steps_saved(run_dir)
            time.sleep(1)
            assert steps_saved(run_dir) == steps_after, "nothing written after the kill"
            continue
        returned, output = finish(proc)
        assert returned == code, output[-3000:]
        stopped = re.findall(rf"stopped by {signal.Signals(signum).name} after step (\d+)", output)
        assert stopped and "Traceback" not in output and "SignalException" not in output, output[-3000:]
        assert steps_saved(run_dir)[-1] == int(stopped[0]) < LAST_STEP, "a checkpoint at the step it stopped"
    resumed_from = steps_saved(run_dir)[-1]
    proc = run(["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", f"RUN_DIR={run_dir}", *JOB])
    assert f"step_{resumed_from:08d}.pt" in proc.stderr
    assert_bit_identical(reference, run_dir, step=LAST_STEP)
    steps = [r["step"] for r in read_metrics(run_dir) if r["kind"] == "train"]
    assert steps == sorted(steps) and len(steps) == len(set(steps)), "metrics of redone steps are not repeated"
    assert starts_logged(run_dir) == len(STOPS) + 1


def test_a_diverging_resume_stops_naming_the_step_and_keeps_finite_checkpoints(reference: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    name = "step_00000040.pt"
    (run_dir / "checkpoints" / name).write_bytes((reference / "checkpoints" / name).read_bytes())
    proc = run(["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", f"RUN_DIR={run_dir}", *JOB, "optim.lr=1e20"],
               expect_ok=False)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    said = re.match(r"error: training diverged by step (\d+): the (loss|gradient) is not finite", last)
    assert said, last
    for checks in DIVERGED_CHECKS:  # what a capability adds to the line and the run dir (a record of the step)
        checks.check_diverged_run(run_dir, int(said.group(1)), said.group(2), last)
    assert "Traceback" not in proc.stdout + proc.stderr and starts_logged(run_dir) == 1, "stopped once, no restart"
    for path in list_checkpoints(run_dir / "checkpoints"):
        weights = load_checkpoint(path)["model"].values()
        assert all(torch.isfinite(tensor).all() for tensor in weights if tensor.is_floating_point()), path


def test_a_stop_signal_after_the_last_step_lets_the_run_finish_and_exit_0(tmp_path: Path) -> None:
    # A large validation set of 32x32 images (about 2 s on 2 ranks) after 4 steps: the signal lands while the final
    # evaluation runs, training done.
    proc = start(tmp_path, 2, *SMALL, "trainer.epochs=1", "data.train_size=256", "data.val_size=8000",
                 "data.image_size=32", "checkpoint.every_n_steps=0")  # fmt: skip
    last = 256 // 64  # the epoch's last step
    wait_for(lambda: (tmp_path / "metrics.jsonl").exists() and any(r["step"] == last for r in read_metrics(tmp_path)),
             "the last step's record")  # fmt: skip
    os.killpg(proc.pid, signal.SIGTERM)
    code, output = finish(proc)
    assert code == 0, output[-3000:]
    assert "training had finished when SIGTERM came: nothing more to do" in output
    assert steps_saved(tmp_path) == [last] and read_metrics(tmp_path)[-1]["kind"] == "val", "the run completed"


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 16 MiB file system of its own (tmpfs, which needs root), to fill while a job writes to it."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def test_a_disk_that_fills_up_mid_run_stops_the_job_once_in_one_line_keeping_its_checkpoints(small_disk: Path) -> None:
    run_dir = small_disk / "run"
    proc = start(run_dir, 2, *JOB)
    wait_for(lambda: 5 in steps_saved(run_dir), "the checkpoint of step 5")
    with open(small_disk / "filler", "wb") as filler, contextlib.suppress(OSError):  # every byte left
        while True:
            filler.write(b"\0" * 2**20)
            filler.flush()
    code, output = finish(proc)
    assert code == 1, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "No space left on device" in errors[0] and "free some space" in errors[0], output
    assert "Logging error" not in output and "Traceback" not in output, output[-3000:]
    assert starts_logged(run_dir) == 1, "no restart: it would fail alike"
    for path in list_checkpoints(run_dir / "checkpoints"):  # what was written stays whole
        load_checkpoint(path)

"""launch/job.py: one launch holds a run dir at a time; the job's exit code follows what the workers said;
a job the workers refused leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.common.run_dir import (
    CONTROL_DIR_ENV,
    DEBUG_DIR_ENV,
    FAILED_MARKER,
    FINISHED_MARKER,
    REFUSED,
    STOPPED_MARKER,
)
from {{cookiecutter.package_name}}.launch import job as job_module
from {{cookiecutter.package_name}}.launch.job import lock_run_dir
from {{cookiecutter.package_name}}.launch.keys import LaunchArgs, LaunchError, parse_args
from {{cookiecutter.package_name}}.launch.plan import plan
from {{cookiecutter.package_name}}.launch.supervise import Forwarder


@pytest.fixture
def forwarder() -> Iterator[Forwarder]:
    """The launcher's signal forwarder, its handlers given back after the test."""
    forwarder = Forwarder()
    yield forwarder
    forwarder.close()


def test_a_run_dir_is_held_by_one_launch_at_a_time_and_freed_with_its_holder(tmp_path: Path) -> None:
    holder = lock_run_dir(tmp_path / "run")
    me = f"{socket.gethostname()} pid {os.getpid()}"
    try:
        with pytest.raises(LaunchError, match=rf"is in use by {re.escape(me)} since"):
            lock_run_dir(tmp_path / "run")
    finally:
        os.close(holder)
    os.close(lock_run_dir(tmp_path / "run"))


@pytest.mark.parametrize(
    ("markers", "torchrun_code", "signalled", "code", "said"),
    [
        ({FINISHED_MARKER: "48\n"}, 143, signal.SIGTERM, 0, "training had finished when SIGTERM came"),
        ({STOPPED_MARKER: "1\n"}, 1, 0, 129, ""),  # SIGHUP sent to torchrun itself, not to the launcher
        ({FAILED_MARKER: "nodes differ\n2\n"}, 1, 0, 2, "error: nodes differ (the traceback: "),
        ({FAILED_MARKER: ""}, 1, 0, 1, "error: a worker stopped the job without saying why"),
        ({}, 143, signal.SIGTERM, 143, ""),
    ],
)
def test_the_jobs_exit_code_follows_what_the_workers_said(tmp_path, capsys, markers, torchrun_code, signalled, code,
                                                          said) -> None:  # fmt: skip
    control, run_dir = tmp_path / "control", tmp_path / "run"
    control.mkdir()
    for name, text in markers.items():
        (control / name).write_text(text)
    forwarder = Forwarder()
    forwarder.signal = signalled
    try:
        assert job_module.job_exit_code(torchrun_code, run_dir, control, forwarder) == code
    finally:
        forwarder.close()
    printed = capsys.readouterr()
    assert said in printed.out + printed.err


@pytest.mark.parametrize("existing", [False, True])
def test_a_job_its_workers_refused_as_they_started_says_one_line_and_leaves_no_new_run_dir(
    tmp_path: Path, monkeypatch, capsys, existing: bool, forwarder: Forwarder
) -> None:
    """The workers' start checks (engine/assembly/checks.py) refuse through FAILED_MARKER with a third line: the
    launcher says the line alone, exits 2, and removes the run dir it made for the job (not one given)."""
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "given" if existing else None
    if existing:
        run_dir.mkdir()

    def refusing_workers(launch, module, arguments, forwarder, failed=None) -> int:
        (Path(launch.env[CONTROL_DIR_ENV]) / FAILED_MARKER).write_text(f"data.root=/x: no such folder\n2\n{REFUSED}\n")
        assert failed is not None and failed(), "the launcher stops the other workers at once"
        return 1

    monkeypatch.setattr(job_module, "torchrun", refusing_workers)
    launch = plan("single", parse_args(["NPROC_PER_NODE=1"], "single"), {"CUDA_VISIBLE_DEVICES": ""}, {})
    code = job_module.train(launch, LaunchArgs(overrides=["task=classification", "data=synthetic"]), run_dir, forwarder)
    assert code == 2
    printed = capsys.readouterr()
    assert printed.err == "error: data.root=/x: no such folder\n", printed.err
    assert "last evaluation" not in printed.out
    assert (
        (tmp_path / "given").is_dir()
        if existing
        else not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").iterdir())
    ), "a run dir made for a refused job is removed; a given one is kept"


def finishing_workers(seen: dict):
    """torchrun's stand-in: what it was handed, then a finished job's files (a validation, the marker)."""

    def torchrun(launch, module, arguments, forwarder, failed=None) -> int:
        control = Path(launch.env[CONTROL_DIR_ENV])
        run_dir = Path(arguments[0].removeprefix("hydra.run.dir=")[1:-1].replace("\\'", "'"))  # Hydra's quoting
        lock = run_dir / (".lock.node0" if launch.mode == "multi" else ".lock")
        seen.update(module=module, arguments=arguments, env=dict(launch.env), control=control, locked=lock.read_text(),
                    failed=failed())  # fmt: skip
        with pytest.raises(LaunchError, match="is in use by"):
            lock_run_dir(run_dir, lock.name)  # held for the whole job: a second launch is refused
        (run_dir / "metrics.jsonl").write_text('{"kind": "val", "step": 4, "val_loss": 0.5}\n'
                                               '{"kind": "train", "step": 5}\nnot json\n')  # fmt: skip
        (control / FINISHED_MARKER).write_text("5\n")
        return 0

    return torchrun


@pytest.mark.parametrize("mode", ["single", "multi"])
def test_a_job_runs_torchrun_on_its_locked_run_dir_and_ends_with_its_last_evaluation(
    tmp_path: Path, monkeypatch, capsys, mode: str, forwarder: Forwarder
) -> None:
    from ..helpers import free_port

    monkeypatch.chdir(tmp_path)
    seen: dict = {}
    monkeypatch.setattr(job_module, "torchrun", finishing_workers(seen))
    keys = ["NPROC_PER_NODE=1", "DEBUG=1"]
    if mode == "multi":
        keys += ["NODE_RANK=0", "NNODES=1", "MASTER_ADDR=127.0.0.1", f"MASTER_PORT={free_port()}"]
    launch = plan(mode, parse_args(keys, mode), {"CUDA_VISIBLE_DEVICES": ""}, {})
    run_dir = tmp_path / "it's, a=dir"
    overrides = ["task=classification", "data=synthetic"]
    assert job_module.train(launch, LaunchArgs(overrides=overrides), run_dir, forwarder) == 0
    assert seen["module"].endswith(".train") and seen["failed"] is False
    assert seen["arguments"] == ["hydra.run.dir='" + str(run_dir).replace("'", "\\'") + "'", *overrides]
    assert seen["locked"].startswith(f"{socket.gethostname()} pid {os.getpid()} since ")
    assert seen["env"][DEBUG_DIR_ENV] == str(run_dir.resolve() / "debug"), "DEBUG=1: the workers' debug dir"
    assert (run_dir / "debug").is_dir() and not seen["control"].exists(), "the control dir goes with the job"
    node = " (node 0)" if mode == "multi" else ""
    out = capsys.readouterr().out
    assert f"run dir: {run_dir}{node}\n" in out
    assert f"run dir: {run_dir}{node} (logs/, metrics.jsonl, checkpoints/)" in out
    assert out.strip().endswith('last evaluation: {"kind": "val", "step": 4, "val_loss": 0.5}')
    os.close(lock_run_dir(run_dir, ".lock.node0" if mode == "multi" else ".lock"))  # released at the end


def test_new_run_dirs_are_dated_and_never_one_that_exists(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    first, second = job_module.new_dir("sweep_"), job_module.new_dir("sweep_")
    assert re.fullmatch(r"outputs/sweep_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", str(first)), first
    assert first.is_dir() and second.is_dir() and second != first
    assert second.name == f"{first.name}_1" or second.name > first.name, "the same second: a suffix"
    job = job_module.new_dir()  # a job's run dir (train without RUN_DIR): the date alone
    assert re.fullmatch(r"outputs/\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", str(job)) and job.is_dir(), job


def test_a_sweep_point_done_before_is_not_trained_again_and_one_that_failed_says_why(
    tmp_path: Path, monkeypatch, capsys, forwarder: Forwarder
) -> None:
    from ..helpers import quick_jobs

    calls: list = []
    monkeypatch.setattr(job_module, "torchrun", quick_jobs(calls))
    monkeypatch.chdir(tmp_path)
    launch = plan("single", parse_args(["NPROC_PER_NODE=1"], "single"), {"CUDA_VISIBLE_DEVICES": ""}, {})
    point = ["task=classification", "data=synthetic", "optim.lr=0.25"]
    row = job_module.run_point(launch, 3, point, tmp_path / "p3", forwarder, trial=7)
    assert row == {"point": 3, "overrides": point, "status": "done", "reason": "", "run_dir": str(tmp_path / "p3"),
                   "final": {"kind": "val", "step": 2, "epoch": 0, "val_loss": 0.25, "val_acc": 0.5,
                             "val_samples": 16}, "trial": 7}  # fmt: skip
    assert (tmp_path / "p3" / "sweep_point.json").read_text() == json.dumps(row) + "\n"
    assert job_module.run_point(launch, 3, point, tmp_path / "p3", forwarder) == row and len(calls) == 1
    assert "point 3: task=classification data=synthetic optim.lr=0.25: done before, not trained again" in (
        capsys.readouterr().out
    )
    monkeypatch.setattr(job_module, "torchrun", quick_jobs(calls, code=1))
    failed = job_module.run_point(launch, 4, point, tmp_path / "p4", forwarder)
    assert (failed["status"], failed["reason"]) == ("failed", "exit code 1")
    refused = job_module.run_point(launch, 5, ["trainer.epochs=0"], tmp_path / "p5", forwarder)
    assert (refused["status"], refused["reason"][:30]) == ("failed", "trainer.epochs must be > 0, go")


def test_a_sweep_point_is_recorded_as_running_while_it_trains_so_that_a_resumed_sweep_trains_it_again(
    tmp_path: Path, monkeypatch
) -> None:
    """While its job runs, sweep_point.json holds the point's row with status "running" (its overrides,
    no reason, no final evaluation yet); a sweep interrupted there trains the point again when resumed.
    The point's dir is made with its parents (a SWEEP_DIR given that does not exist yet)."""
    from ..helpers import quick_jobs

    calls: list = []
    during: list[str] = []
    finish = quick_jobs(calls)
    run_dir = tmp_path / "new sweep" / "p2"

    def recording_workers(launch, module, arguments, forwarder, failed=None) -> int:
        during.append((run_dir / "sweep_point.json").read_text())
        return finish(launch, module, arguments, forwarder, failed)

    monkeypatch.setattr(job_module, "torchrun", recording_workers)
    monkeypatch.chdir(tmp_path)
    launch = plan("single", parse_args(["NPROC_PER_NODE=1"], "single"), {"CUDA_VISIBLE_DEVICES": ""}, {})
    point = ["task=classification", "data=synthetic", "optim.lr=0.5"]
    forwarder = Forwarder()
    try:
        assert job_module.run_point(launch, 2, point, run_dir, forwarder, trial=1)["status"] == "done"
        running = {"point": 2, "overrides": point, "status": "running", "reason": "", "run_dir": str(run_dir),
                   "final": {}, "trial": 1}  # fmt: skip
        assert during == [json.dumps(running) + "\n"]
        (run_dir / "sweep_point.json").write_text(during[0])  # as a sweep interrupted during the job left it
        assert job_module.run_point(launch, 2, point, run_dir, forwarder, trial=1)["status"] == "done"
    finally:
        forwarder.close()
    assert len(calls) == 2, "a point left running is trained again"


class PipedStream:
    """sys.stdout or sys.stderr as Python buffers it on a pipe (a cluster job's log): what is written
    reaches the reader, `shown` (both streams in one, as `2>&1` gives them), only once flushed."""

    def __init__(self, shown: list[str]) -> None:
        self.shown, self.pending = shown, ""

    def write(self, text: str) -> int:
        self.pending += text
        return len(text)

    def flush(self) -> None:
        self.shown.append(self.pending)
        self.pending = ""


def test_a_sweep_points_lines_reach_a_piped_console_as_they_are_said_before_its_jobs_error(
    tmp_path: Path, monkeypatch
) -> None:
    """On a pipe stdout is buffered: each point's line is flushed as it is said, so that a log shows it
    before its job's error (stderr), and a point done before is told before the sweep goes on."""
    from ..helpers import quick_jobs

    shown: list[str] = []
    monkeypatch.setattr(sys, "stdout", PipedStream(shown))
    monkeypatch.setattr(sys, "stderr", PipedStream(shown))
    monkeypatch.setattr(job_module, "torchrun", quick_jobs([]))
    monkeypatch.chdir(tmp_path)
    launch = plan("single", parse_args(["NPROC_PER_NODE=1"], "single"), {"CUDA_VISIBLE_DEVICES": ""}, {})
    forwarder = Forwarder()
    try:
        job_module.run_point(launch, 5, ["trainer.epochs=0", "optim.lr=0.5"], tmp_path / "p5", forwarder)
        error = "trainer.epochs must be > 0, got 0: set trainer.epochs=<positive number>"
        assert "".join(shown) == f"point 5: trainer.epochs=0 optim.lr=0.5\nerror: {error}\n", "the line, then its error"
        shown.clear()
        (tmp_path / "p6").mkdir()
        (tmp_path / "p6" / "sweep_point.json").write_text(json.dumps({"point": 6, "status": "done"}) + "\n")
        job_module.run_point(launch, 6, ["optim.lr=0.5", "model=small_cnn"], tmp_path / "p6", forwarder)
        assert "".join(shown) == "point 6: optim.lr=0.5 model=small_cnn: done before, not trained again\n"
    finally:
        forwarder.close()


def test_the_run_dir_is_freed_when_the_job_ends_in_an_error(tmp_path: Path, monkeypatch, forwarder: Forwarder) -> None:
    def giving_up(launch, module, arguments, forwarder, failed=None) -> int:
        raise LaunchError("not all NNODES=2 nodes joined")  # as torchrun's supervision gives up on a rendezvous

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(job_module, "torchrun", giving_up)
    launch = plan("single", parse_args(["NPROC_PER_NODE=1"], "single"), {"CUDA_VISIBLE_DEVICES": ""}, {})
    with pytest.raises(LaunchError, match="not all NNODES=2 nodes joined"):
        job_module.train(launch, LaunchArgs(overrides=["task=classification"]), tmp_path / "run", forwarder)
    os.close(lock_run_dir(tmp_path / "run"))  # free again in this process: a sweep's next try may take it

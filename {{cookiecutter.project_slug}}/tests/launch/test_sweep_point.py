"""launch/sweep_point.py: a sweep's point as one job, recorded in its sweep_point.json: done before, not
trained again; interrupted, trained again; failed or refused, with its reason; its lines said as they come."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.launch import job as job_module
from {{cookiecutter.package_name}}.launch.keys import parse_args
from {{cookiecutter.package_name}}.launch.plan import plan
from {{cookiecutter.package_name}}.launch.supervise import Forwarder
from {{cookiecutter.package_name}}.launch.sweep_point import run_point

from ..helpers import quick_jobs


@pytest.fixture
def forwarder() -> Iterator[Forwarder]:
    """The launcher's signal forwarder, its handlers given back after the test."""
    forwarder = Forwarder()
    yield forwarder
    forwarder.close()


def test_a_sweep_point_done_before_is_not_trained_again_and_one_that_failed_says_why(
    tmp_path: Path, monkeypatch, capsys, forwarder: Forwarder
) -> None:
    calls: list = []
    monkeypatch.setattr(job_module, "torchrun", quick_jobs(calls))
    monkeypatch.chdir(tmp_path)
    launch = plan("single", parse_args(["NPROC_PER_NODE=1"], "single"), {"CUDA_VISIBLE_DEVICES": ""}, {})
    point = ["task=classification", "data=synthetic", "optim.lr=0.25"]
    row = run_point(launch, 3, point, tmp_path / "p3", forwarder, trial=7)
    assert row == {"point": 3, "overrides": point, "status": "done", "reason": "", "run_dir": str(tmp_path / "p3"),
                   "final": {"kind": "val", "step": 2, "epoch": 0, "val_loss": 0.25, "val_acc": 0.5,
                             "val_samples": 16}, "trial": 7}  # fmt: skip
    assert (tmp_path / "p3" / "sweep_point.json").read_text() == json.dumps(row) + "\n"
    assert run_point(launch, 3, point, tmp_path / "p3", forwarder) == row and len(calls) == 1
    assert "point 3: task=classification data=synthetic optim.lr=0.25: done before, not trained again" in (
        capsys.readouterr().out
    )
    monkeypatch.setattr(job_module, "torchrun", quick_jobs(calls, code=1))
    failed = run_point(launch, 4, point, tmp_path / "p4", forwarder)
    assert (failed["status"], failed["reason"]) == ("failed", "exit code 1")
    refused = run_point(launch, 5, ["trainer.epochs=0"], tmp_path / "p5", forwarder)
    assert (refused["status"], refused["reason"][:30]) == ("failed", "trainer.epochs must be > 0, go")


def test_a_sweep_point_is_recorded_as_running_while_it_trains_so_that_a_resumed_sweep_trains_it_again(
    tmp_path: Path, monkeypatch
) -> None:
    """While its job runs, sweep_point.json holds the point's row with status "running" (its overrides,
    no reason, no final evaluation yet); a sweep interrupted there trains the point again when resumed.
    The point's dir is made with its parents (a SWEEP_DIR given that does not exist yet)."""
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
        assert run_point(launch, 2, point, run_dir, forwarder, trial=1)["status"] == "done"
        running = {"point": 2, "overrides": point, "status": "running", "reason": "", "run_dir": str(run_dir),
                   "final": {}, "trial": 1}  # fmt: skip
        assert during == [json.dumps(running) + "\n"]
        (run_dir / "sweep_point.json").write_text(during[0])  # as a sweep interrupted during the job left it
        assert run_point(launch, 2, point, run_dir, forwarder, trial=1)["status"] == "done"
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
    shown: list[str] = []
    monkeypatch.setattr(sys, "stdout", PipedStream(shown))
    monkeypatch.setattr(sys, "stderr", PipedStream(shown))
    monkeypatch.setattr(job_module, "torchrun", quick_jobs([]))
    monkeypatch.chdir(tmp_path)
    launch = plan("single", parse_args(["NPROC_PER_NODE=1"], "single"), {"CUDA_VISIBLE_DEVICES": ""}, {})
    forwarder = Forwarder()
    try:
        run_point(launch, 5, ["trainer.epochs=0", "optim.lr=0.5"], tmp_path / "p5", forwarder)
        error = "trainer.epochs must be > 0, got 0: set trainer.epochs=<positive number>"
        assert "".join(shown) == f"point 5: trainer.epochs=0 optim.lr=0.5\nerror: {error}\n", "the line, then its error"
        shown.clear()
        (tmp_path / "p6").mkdir()
        (tmp_path / "p6" / "sweep_point.json").write_text(json.dumps({"point": 6, "status": "done"}) + "\n")
        run_point(launch, 6, ["optim.lr=0.5", "model=small_cnn"], tmp_path / "p6", forwarder)
        assert "".join(shown) == "point 6: optim.lr=0.5 model=small_cnn: done before, not trained again\n"
    finally:
        forwarder.close()

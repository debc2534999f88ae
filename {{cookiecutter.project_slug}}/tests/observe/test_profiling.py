"""profiling.py in this process: which steps a trace holds (numbered as metrics.jsonl numbers them,
across resumes), the trace as a Chrome trace file, and whether trainer.profile_steps builds one. A run under
torchrun, one trace per rank: tests/e2e/test_training.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.observe.hangs import StallWatch
from {{cookiecutter.package_name}}.observe.profiling import StepProfiler, build_watch

from ..helpers import SMALL, compose_config, cpu_env, run, trainer


def run_steps(profiler: StepProfiler, numbers: range) -> None:
    """A loop as the trainer's: begin_step(N) at the start of step N, then some work, then close()."""
    weights = torch.randn(64, 64)
    for number in numbers:
        profiler.begin_step(number)
        for _ in range(3):
            weights = torch.tanh(weights @ weights)
    profiler.close()


def traced_steps(folder: Path, rank: int = 0) -> list[int]:
    """The steps (ProfilerStep#N spans) of the one trace this rank wrote into `folder`."""
    traces = sorted(folder.glob(f"rank_{rank}.*.pt.trace.json"))
    assert len(traces) == 1, traces
    events = json.loads(traces[0].read_text())["traceEvents"]
    return sorted({int(m.group(1)) for e in events if (m := re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", "")))})


def test_exactly_the_steps_asked_for_are_in_the_trace(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    run_steps(StepProfiler(3, 5, tmp_path, rank=0, device=torch.device("cpu")), range(1, 10))
    assert traced_steps(tmp_path) == [3, 4, 5]
    assert "profile of steps 3-5" in caplog.text and "aten::tanh" in caplog.text  # the top operators


def test_a_resumed_run_traces_the_rest_of_the_range_under_the_same_numbers(tmp_path: Path) -> None:
    run_steps(StepProfiler(3, 6, tmp_path, rank=1, device=torch.device("cpu")), range(5, 9))  # resumed at step 4
    assert traced_steps(tmp_path, rank=1) == [5, 6]


def test_a_run_that_ends_inside_the_range_keeps_what_it_recorded(tmp_path: Path) -> None:
    run_steps(StepProfiler(2, 50, tmp_path, rank=0, device=torch.device("cpu")), range(1, 5))
    assert traced_steps(tmp_path) == [2, 3, 4]


def test_a_run_resumed_past_the_range_writes_nothing(tmp_path: Path) -> None:
    run_steps(StepProfiler(2, 3, tmp_path, rank=0, device=torch.device("cpu")), range(7, 9))
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_profile_steps_off_leaves_the_loop_without_a_profiler(tmp_path: Path) -> None:
    config = to_train_config(compose_config())
    assert config.trainer.profile_steps == ""
    assert build_watch(config, tmp_path, cpu_env(0, 1)) is None
    profiled = to_train_config(compose_config(["trainer.profile_steps=2:3"]))
    assert isinstance(build_watch(profiled, tmp_path, cpu_env(0, 1)), StepProfiler)


def test_the_built_trainer_watches_with_what_observe_has(tmp_path: Path) -> None:
    """assembly/build.py finds the diagnostics by build_watch: the stall watch always, the profiler when asked."""
    assert [type(watch) for watch in trainer(tmp_path / "plain").watches] == [StallWatch]
    profiled = trainer(tmp_path / "profiled", "trainer.profile_steps=2:3").watches
    assert [type(watch) for watch in profiled] == [StallWatch, StepProfiler]
    for watch in profiled:
        watch.close()


@pytest.mark.slow
def test_a_bad_profile_range_stops_the_launch_with_one_line(tmp_path: Path) -> None:
    """(The other bad ranges: tests/config/test_diagnostics.py, in-process.)"""
    command = ["bash", "scripts/run_single.sh", f"RUN_DIR={tmp_path / 'run'}", *SMALL, "trainer.profile_steps=5:3"]
    proc = run(command, expect_ok=False)
    assert proc.returncode == 2 and proc.stderr.startswith("error: trainer.profile_steps=5:3: START is after END")
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "run").exists()

"""trainer.profile_steps as users meet it: a CPU run of two processes through the launch script
leaves one Chrome trace per rank in <run dir>/profile/, holding exactly the steps asked for; a bad
value stops the launch with one line before anything starts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ..helpers import SMALL, run


def trace_steps(path: Path) -> list[int]:
    """The optimizer steps a trace file holds: its ProfilerStep#<N> spans."""
    events = json.loads(path.read_text())["traceEvents"]
    return sorted({int(m.group(1)) for e in events if (m := re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", "")))})


@pytest.mark.slow
def test_a_cpu_run_writes_a_trace_per_rank_of_exactly_the_asked_steps(tmp_path: Path) -> None:
    proc = run(["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", f"RUN_DIR={tmp_path}", *SMALL, "trainer.epochs=1",
                "data.train_size=512", "trainer.profile_steps=3:4"])  # fmt: skip
    for rank in (0, 1):
        traces = list((tmp_path / "profile").glob(f"rank_{rank}.*.pt.trace.json"))  # tensorboard_trace_handler's names
        assert len(traces) == 1, proc.stderr[-3000:]  # two: a worker crashed and torchrun restarted the job
        assert trace_steps(traces[0]) == [3, 4], traces[0]
    assert "profile of steps 3-4" in proc.stderr and "Self CPU time total" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize(  # the other bad ranges: tests/observe/test_profiling.py, in-process
    ("value", "message"), [("5:3", "trainer.profile_steps=5:3: START is after END")]
)
def test_a_bad_profile_range_stops_the_launch_with_one_line(tmp_path: Path, value: str, message: str) -> None:
    command = ["bash", "scripts/run_single.sh", f"RUN_DIR={tmp_path / 'run'}", *SMALL, f"trainer.profile_steps={value}"]
    proc = run(command, expect_ok=False)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {message}"), proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "run").exists()

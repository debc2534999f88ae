"""scripts/check_comm.sh: every collective verified, bandwidth measured, a PASS/FAIL table."""

from __future__ import annotations

import re

import pytest

from ..helpers import free_port, run
from .jobs import finish_nodes, node

pytestmark = pytest.mark.slow


def assert_report(output: str, world_size: int) -> None:
    assert f"world size {world_size}, backend gloo" in output
    for check in ("all_reduce", "broadcast", "all_gather", "barrier", "new_group"):
        assert re.search(rf"^{check}\s+PASS", output, re.MULTILINE), output
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", output, re.MULTILINE)
    assert [int(size) for size, *_ in rows] == [2**k for k in range(10, 27, 2)]
    # A 1 KiB all-reduce over gloo can print as 0.000 GB/s; the large sizes must show a real figure.
    assert all(float(busbw) >= 0 for *_, busbw in rows) and float(rows[-1][3]) > 0
    assert re.search(r"^overall\s+PASS$", output, re.MULTILINE)
    assert len(re.findall(r"^\s+\d+\s+\S+\s+\d+\s+cpu\s+gloo$", output, re.MULTILINE)) == world_size


# One node (`bash scripts/check_comm.sh`, run_single.sh's keys): the same check, started by the plan
# tests/launch/test_plan.py checks in-process (--standalone, two processes, no restart); the check itself,
# its table and its exit code, through the script on two nodes here.
def test_two_nodes_with_the_launcher_keys() -> None:
    port = free_port()
    outputs = finish_nodes(node(1, port, script="check_comm.sh"), node(0, port, script="check_comm.sh"))
    assert_report(outputs[1], 2)


def test_a_backend_that_cannot_work_fails_with_one_line() -> None:
    proc = run(["bash", "scripts/check_comm.sh", "NPROC_PER_NODE=1", "dist.backend=nccl"], expect_ok=False)
    assert proc.returncode != 0
    assert "error: dist.backend=nccl needs a GPU" in proc.stdout + proc.stderr

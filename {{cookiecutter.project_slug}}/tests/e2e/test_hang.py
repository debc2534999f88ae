"""A rank that stalls, as users meet it: `bash scripts/run_single.sh DEBUG=1 ...` on gloo, two
processes, and a model of the user's own (through the model seam) whose forward sleeps on rank 1
in step 5. The job must fail once, soon after dist.timeout_s, with one line naming rank 1 and the
step, and leave every rank's stack in the run dir."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from ..helpers import job_env
from .jobs import project_copy

STALLING_MODEL = '''"""A classifier whose forward sleeps on one rank in one training step: a stalled rank."""

import os
import time
from pathlib import Path

from torch import nn


class StallingNet(nn.Module):
    def __init__(self, num_classes, rank, step, seconds, mark):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, num_classes))  # data=synthetic's images
        self.rank, self.step, self.seconds, self.mark, self.calls = rank, step, seconds, Path(mark), 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == self.step and int(os.environ.get("RANK", "-1")) == self.rank:
                self.mark.write_text(f"{time.time()}\\n")  # when the stall began, for the test
                time.sleep(self.seconds)
        return self.net(x)
'''
STALLING_YAML = """_target_: stalling.StallingNet
num_classes: ${data.num_classes}
rank: 1
step: 5
seconds: 600
mark: stalled_at
"""
TIMEOUT_S = 6  # above the workers' start (forked from torchrun's agent at once): init_process_group waits this long too
# The ranks that waited give the others 5 s to say so too, then write their stacks (0.5 s) and stop;
# the launcher polls for that every 0.2 s. The rest is slack for a loaded machine.
MARGIN_S = 15


@pytest.fixture(scope="module")
def stalling_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    project = project_copy(tmp_path_factory.mktemp("hang") / "project")
    (project / "stalling.py").write_text(STALLING_MODEL)
    (project / "configs" / "model" / "stalling.yaml").write_text(STALLING_YAML)
    return project


@pytest.mark.slow
def test_a_stalled_rank_is_named_soon_after_the_timeout_with_every_rank_stack(
    stalling_project: Path, tmp_path: Path
) -> None:
    run_dir, mark = tmp_path / "run", tmp_path / "stalled_at"
    command = ["bash", "scripts/run_single.sh", "DEBUG=1", "NPROC_PER_NODE=2", "MAX_RESTARTS=3", f"RUN_DIR={run_dir}",
               "model=stalling", f"model.mark={mark}", "task=classification", "data=synthetic", "data.batch_size=16",
               "dist.backend=gloo", f"dist.timeout_s={TIMEOUT_S}"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=stalling_project, env=job_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    output, failed_at = [], None
    for line in proc.stdout:  # the error line's arrival, not the launcher's exit, ends the wait
        output.append(line)
        if line.startswith("error: ") and failed_at is None:
            failed_at = time.time()
    code = proc.wait(timeout=60)
    text = "".join(output)
    assert code == 1 and failed_at is not None, text[-4000:]
    waited = failed_at - float(mark.read_text())
    assert TIMEOUT_S <= waited <= TIMEOUT_S + MARGIN_S, f"failed {waited:.1f} s after the stall"

    error = next(line for line in output if line.startswith("error: "))
    expected = (
        rf"error: rank 1 did not arrive at step 5 within dist.timeout_s={TIMEOUT_S} s \(rank 0 waited; alive but "
        rf"stuck: rank 1: in step 5, pid \d+ on \S+\); every rank's stack: {re.escape(str(run_dir / 'debug'))}/"
    )
    assert re.match(expected, error), error
    assert text.count("] run dir: ") == 1, "one generation of workers: a stall is not restarted"

    stalled = (run_dir / "debug" / "stack_rank_1.txt").read_text()
    assert f"Timeout (0:00:{TIMEOUT_S:02d})!" in stalled, "its watchdog fired while it slept"
    assert re.search(r'stalling\.py", line \d+ in forward', stalled), stalled
    waiter = (run_dir / "debug" / "stack_rank_0.txt").read_text()
    assert "waited at step 5 for rank 1; it waited here:" in waiter and "backward" in waiter, waiter

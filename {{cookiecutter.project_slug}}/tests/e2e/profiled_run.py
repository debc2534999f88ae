"""trainer.profile_steps on test_training.py's shared two-process job: one Chrome trace per rank in
<run dir>/profile/, holding exactly the steps asked for (numbered as metrics.jsonl numbers them)."""

from __future__ import annotations

from pathlib import Path

from ..observe.test_profiling import traced_steps

SHARED_RUN_OVERRIDES = ("trainer.profile_steps=3:4",)


def check_shared_run(run_dir: Path, output: str) -> None:
    for rank in (0, 1):  # two traces of a rank: a worker crashed and torchrun restarted the job
        assert traced_steps(run_dir / "profile", rank) == [3, 4], output[-3000:]
    assert "profile of steps 3-4" in output and "Self CPU time total" in output, output[-3000:]

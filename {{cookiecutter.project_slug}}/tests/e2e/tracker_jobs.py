"""What the tracker jobs share: a job whose rank 0 (the trackers' process) is SIGKILLed past a checkpoint
and restarted by torchrun, and what metrics.jsonl says every tracker run must then hold."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from {{cookiecutter.package_name}}.observe.logs import metric_name

from ..helpers import SMALL
from .jobs import finish, start, steps_saved, wait_for, worker_pid

# 4 epochs of 16 steps on 2 processes, a record every 2 steps, a checkpoint every 10 and at each
# epoch's end: after the checkpoints of steps 20, 32, 40 and 50, three records come before the next one.
JOB = [
    *SMALL,
    "trainer.epochs=4",
    "trainer.log_every_n_steps=2",
    "checkpoint.every_n_steps=10",
    "checkpoint.keep_last=20",
]
LAST_STEP = 64


def records(run_dir: Path) -> list[dict]:
    """metrics.jsonl's records so far (a line being written is skipped)."""
    path = run_dir / "metrics.jsonl"
    found = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return found


def kill_rank_zero_past_a_checkpoint(run_dir: Path) -> None:
    """SIGKILL rank 0 once it has logged three steps past a checkpoint written while its tracker runs
    were open: a tracker sent those records would get them twice, as the restart redoes the steps."""
    wait_for(lambda: (run_dir / "trackers.json").is_file(), "the tracker runs to open")
    opened_after = max(steps_saved(run_dir), default=0)

    def ready() -> bool:
        newest = max(steps_saved(run_dir), default=0)
        past = [record for record in records(run_dir) if record["step"] > newest]
        return newest > opened_after and len(past) >= 3

    wait_for(ready, "three steps logged past a checkpoint")
    os.kill(worker_pid(run_dir, 0), signal.SIGKILL)


def points_of_metrics_jsonl(run_dir: Path) -> list[tuple[str, int]]:
    """(metric, step) for every scalar metrics.jsonl holds, by the trackers' names."""
    kinds_and_steps = [(record["kind"], record["step"]) for record in records(run_dir)]
    assert len(kinds_and_steps) == len(set(kinds_and_steps)), "metrics.jsonl itself holds every step once"
    names = [(metric_name(key), record["step"]) for record in records(run_dir) for key in record]
    return [(name, step) for name, step in names if name is not None]


def run_and_kill(run_dir: Path, *overrides: str) -> str:
    """The job, killed once, to its end; the tracker run id it kept."""
    proc = start(run_dir, 2, *JOB, *overrides)
    kill_rank_zero_past_a_checkpoint(run_dir)
    code, output = finish(proc)
    assert code == 0, output[-3000:]
    assert (run_dir / "logs" / "rank_0.log").read_text().count("run dir:") == 2, "torchrun restarted the workers once"
    return output

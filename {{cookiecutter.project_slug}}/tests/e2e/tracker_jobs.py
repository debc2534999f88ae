"""What the tracker jobs share: a job whose rank 0 (the trackers' process) is SIGKILLed past a checkpoint
and restarted by torchrun, and what metrics.jsonl says every tracker run must then hold."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import signal
from pathlib import Path
from types import ModuleType

from {{cookiecutter.package_name}}.observe.logs import metric_name
from {{cookiecutter.package_name}}.observe.sinks import trackers

from ..helpers import SMALL
from .jobs import finish, start, steps_saved, wait_for, worker_pid

# 4 epochs of 16 steps on 2 processes, a record every 2 steps, a checkpoint every 10 and at each
# epoch's end: after the checkpoints of steps 20, 32, 40 and 50, three records come before the next one.
# 32x32 images: steps slow enough that the kill lands while the tracker runs are open.
JOB = [
    *SMALL,
    "data.image_size=32",
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


# One job for every tracker the project has: a tracker whose test needs a service of its own (a server) hosts
# the job, and each other tracker rides on it through its tests/e2e/<tracker>_jobs.py (present where it was
# chosen, as the trackers' modules are: nothing here names them). A rider module has OVERRIDES,
# prepare(monkeypatch, tmp_path) and check(run_dir, output); a rider's own test runs where no host does.
E2E = Path(__file__).parent


def tracker_names() -> list[str]:
    """The trackers this project has (observe/sinks/trackers/<name>_tracker.py)."""
    return sorted(info.name.removesuffix("_tracker") for info in pkgutil.iter_modules(trackers.__path__)
                  if info.name.endswith("_tracker"))  # fmt: skip


def riders(host: str) -> list[ModuleType]:
    """The other trackers' job helpers: their runs ride on `host`'s job and are checked there."""
    return [importlib.import_module(f".{name}_jobs", __package__) for name in tracker_names()
            if name != host and (E2E / f"{name}_jobs.py").is_file()]  # fmt: skip


def hosted(rider: str) -> bool:
    """Whether another tracker's job carries `rider`'s checks (a tracker with a test and no rider module)."""
    return any(name != rider and (E2E / f"test_{name}.py").is_file() and not (E2E / f"{name}_jobs.py").is_file()
               for name in tracker_names())  # fmt: skip

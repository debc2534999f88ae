"""What the tracker jobs share: a job whose rank 0 (the trackers' process) is SIGKILLed past a checkpoint
and restarted by torchrun, and what metrics.jsonl says every tracker run must then hold."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.observe.logs import metric_name

from ..helpers import PYTHON, SMALL, run
from .jobs import finish, start, steps_saved, wait_for, worker_pid

TRACKERS = "{{cookiecutter.package_name}}.observe.sinks.trackers"
# The trackers this project was generated with: with both, one job runs them side by side
# (test_mlflow.py) and test_wandb.py's own job is skipped.
HAS_MLFLOW = importlib.util.find_spec(f"{TRACKERS}.mlflow_tracker") is not None
HAS_WANDB = importlib.util.find_spec(f"{TRACKERS}.wandb_tracker") is not None

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


def wandb_offline(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """W&B offline, with no API key and nothing of the user's (settings, caches, netrc): nothing leaves
    the machine. Checks first that this wandb has the inspector the test reads the run back with."""
    inspector = run([PYTHON, "-m", "wandb", "leet", "inspect", "--help"], expect_ok=False)
    assert inspector.returncode == 0, "this wandb has no `wandb leet inspect`: pip install -e '.[dev]' (wandb>=0.31)"
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(home / name.lower()))
    monkeypatch.setenv("NETRC", str(home / "netrc"))
    monkeypatch.setenv("WANDB_MODE", "offline")


def wandb_rows(run_file: Path) -> list[dict]:
    """The history rows of a W&B transaction log, as W&B's own inspector prints them."""
    printed = run([PYTHON, "-m", "wandb", "leet", "inspect", "--json", str(run_file)], expect_ok=False)
    rows = [json.loads(line) for line in printed.stdout.splitlines() if line.startswith("{")]
    return [row["history"]["item"] for row in rows if row.get("type") == "history"]


def assert_one_wandb_run_with_every_step_once(run_dir: Path, output: str) -> None:
    """After run_and_kill with log.wandb=true (log.wandb_mode=online, but there is no API key)."""
    assert "wandb: no API key" in output
    run_id = json.loads((run_dir / "trackers.json").read_text())["wandb"]
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert [path.name for path in files] == [f"run-{run_id}.wandb"] * 2, "one run id, reused by the restart"
    rows = [row for path in files for row in wandb_rows(path)]
    got = [(name, row["_step"]) for row in rows for name in row if not name.startswith("_")]
    assert Counter(got) == Counter(points_of_metrics_jsonl(run_dir)), "every logged step once"
    final = [record for record in records(run_dir) if record["kind"] == "val"][-1]
    (last_row,) = [row for row in rows if row["_step"] == final["step"]]
    assert (last_row["val/loss"], last_row["val/acc"]) == (final["val_loss"], final["val_acc"])

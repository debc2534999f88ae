"""Sweeps as users run them: -m on run_single.sh, each point its own torchrun job in one sweep dir,
results.md, a sweep launched again goes on where it stopped; an Optuna sweep, one job per trial."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..helpers import SMALL, run
from .jobs import read_metrics

JOB = [*SMALL, "trainer.epochs=1", "data.train_size=128", "data.val_size=50"]


@pytest.mark.slow
def test_a_sweep_runs_each_point_once_and_continues_where_it_stopped(tmp_path: Path) -> None:
    """Two points, one refused before torchrun: one torchrun job, then one more for the point whose status
    was lost. That a point done before is not trained again: the optuna sweep's test below, and
    tests/launch/test_sweep_point.py (each status a point can have)."""
    sweep_dir = tmp_path / "sweep"
    command = ["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", f"SWEEP_DIR={sweep_dir}", "-m",
               "optim.lr=0.1,-1", *JOB]  # fmt: skip
    first = run(command, expect_ok=False)
    assert first.returncode == 1, "a failed point makes the sweep's exit code 1"
    table = (sweep_dir / "results.md").read_text()
    rows = [line for line in table.splitlines()[2:]]
    assert len(rows) == 2 and "| done |" in rows[0] and "failed (optim.lr must be a number > 0" in rows[1], table
    assert table in first.stdout
    runs = sorted(path.name for path in sweep_dir.iterdir() if path.is_dir())
    assert runs == ["000_optim.lr=0.1", "001_optim.lr=-1"]
    assert read_metrics(sweep_dir / runs[0])[-1]["kind"] == "val"
    # The first point was interrupted (its status lost): launched again, it resumes from its checkpoint.
    (sweep_dir / runs[0] / "sweep_point.json").unlink()
    again = run(command, expect_ok=False)
    assert again.returncode == 1 and "point 0: optim.lr=0.1" in again.stdout
    assert "training had already finished" in again.stderr, "the interrupted point resumed, not restarted"
    assert json.loads((sweep_dir / runs[0] / "sweep_point.json").read_text())["status"] == "done"
    assert (sweep_dir / "results.md").read_text().count("| done |") == 1


@pytest.mark.slow
def test_an_optuna_sweep_runs_one_torchrun_job_per_trial(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    space = ["hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "optim.lr=tag(log,interval(0.01,0.3))"]
    command = ["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", f"SWEEP_DIR={sweep_dir}", "-m", *space, *JOB]
    first = run(command)
    trials = [json.loads((sweep_dir / f"00{i}_trial" / "sweep_point.json").read_text()) for i in (0, 1)]
    assert [trial["status"] for trial in trials] == ["done", "done"]
    rates = [trial["params"]["optim.lr"] for trial in trials]
    assert all(0.01 <= rate <= 0.3 for rate in rates) and rates[0] != rates[1]
    assert "best trial:" in first.stdout and (sweep_dir / "results.md").read_text().count("| done |") == 2
    again = run(command)
    assert again.stdout.count("done before, not trained again") == 2

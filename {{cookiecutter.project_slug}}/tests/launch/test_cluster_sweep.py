"""launch/cluster_sweep.py with stand-ins for sbatch and squeue on PATH (the real Slurm: tests/e2e/test_slurm.py):
each point not finished is one sbatch of scripts/slurm.sbatch with its run dir and overrides; a finished one is
not submitted again, a queued one is waited for; a point's bad config is its own failure, nothing submitted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.common.run_dir import FINISHED_MARKER
from {{cookiecutter.package_name}}.launch import cluster_sweep
from {{cookiecutter.package_name}}.launch.keys import LaunchError, parse_args
from {{cookiecutter.package_name}}.launch.plan import plan

POINT = ["task=classification", "data=synthetic", "model=small_cnn"]


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch) -> Path:
    """sbatch records its arguments and answers the next job id; squeue lists the ids in `queue` once each
    call (a job leaves the queue after one look)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/bin/bash\nn=$(( $(ls "$CALLS" | wc -l) + 41 ))\n'
                                    'printf "%s\\n" "$@" > "$CALLS/$n"\necho "$n;cluster"\n')  # fmt: skip
    (bin_dir / "squeue").write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$CALLS/../squeue_args"\n'
                                    'cat "$QUEUE" 2>/dev/null; : > "$QUEUE"\n')  # fmt: skip
    for tool in ("sbatch", "squeue"):
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "calls").mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(tmp_path / "calls"))
    monkeypatch.setenv("QUEUE", str(tmp_path / "queue"))
    monkeypatch.setattr(cluster_sweep, "POLL_S", 0.01)
    return tmp_path


def launch(*keys: str):
    return plan("single", parse_args(["NPROC_PER_NODE=1", *keys], "single"), {"CUDA_VISIBLE_DEVICES": ""}, {})


def test_each_unfinished_point_is_one_job_and_a_finished_one_is_not_submitted_again(fake_slurm: Path, capsys) -> None:
    sweep = fake_slurm / "sweep"
    done_dir = sweep / "000_lr=0.1"
    done_dir.mkdir(parents=True)
    (done_dir / FINISHED_MARKER).write_text("8\n")
    (done_dir / "metrics.jsonl").write_text('{"kind": "val", "step": 8, "val_loss": 0.7}\n')
    points = [(0, [*POINT, "optim.lr=0.1"], done_dir), (1, [*POINT, "optim.lr=0.2"], sweep / "001_lr=0.2")]
    (fake_slurm / "queue").write_text("41\n")  # the new job is in the queue at the first look, gone at the next
    rows = cluster_sweep.cluster_sweep(launch("SUBMIT_ARGS=--nodes=1 --time=10"), points)
    calls = sorted((fake_slurm / "calls").iterdir())
    assert [path.name for path in calls] == ["41"], "one submission: the finished point is not submitted again"
    assert calls[0].read_text().splitlines() == [
        "--parsable", "--job-name=sweep_001", f"--output={sweep}/001_lr=0.2/slurm_%j.out", "--nodes=1", "--time=10",
        "scripts/slurm.sbatch", f"RUN_DIR={sweep}/001_lr=0.2", *POINT, "optim.lr=0.2",
    ]  # fmt: skip
    assert [(row["status"], row.get("job")) for row in rows] == [("done", None), ("failed", "41")]
    assert rows[0]["final"]["val_loss"] == 0.7 and "job 41 ended unfinished" in rows[1]["reason"]
    saved = json.loads((sweep / "001_lr=0.2" / "sweep_point.json").read_text())
    assert saved["status"] == "failed" and saved["job"] == "41"
    out = capsys.readouterr().out
    assert "point 0: " in out and "done before, not submitted again" in out and "submitted as job 41" in out


def test_a_point_whose_job_is_still_queued_is_waited_for_not_submitted_twice(fake_slurm: Path, capsys) -> None:
    run_dir = fake_slurm / "sweep" / "000"
    run_dir.mkdir(parents=True)
    (run_dir / "sweep_point.json").write_text(json.dumps({"status": "submitted", "job": "7"}) + "\n")
    (fake_slurm / "queue").write_text("7\n")
    rows = cluster_sweep.cluster_sweep(launch(), [(0, POINT, run_dir)])
    assert not list((fake_slurm / "calls").iterdir()) and rows[0]["job"] == "7"
    asked = (fake_slurm / "squeue_args").read_text().splitlines()
    assert asked == ["-h", "-o", "%i", "-j", "7"], "the sweep's own jobs, ids alone, no header"
    assert "job 7 still in the queue, waited for" in capsys.readouterr().out


def test_a_points_bad_config_fails_that_point_before_any_submission(fake_slurm: Path) -> None:
    rows = cluster_sweep.cluster_sweep(launch(), [(0, [*POINT, "trainer.epochs=0"], fake_slurm / "sweep" / "000")])
    assert rows[0]["status"] == "failed" and "trainer.epochs must be > 0" in rows[0]["reason"]
    assert not list((fake_slurm / "calls").iterdir())


def test_without_slurm_the_sweep_says_so_in_one_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, no squeue
    with pytest.raises(LaunchError, match=r"SUBMIT=slurm: sbatch is not installed here"):
        cluster_sweep.slurm(*["sbatch", "--parsable"])

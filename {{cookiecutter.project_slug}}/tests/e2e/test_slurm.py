"""scripts/slurm.sbatch on a real, private one-node Slurm (tests/e2e/local_slurm.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..helpers import PROJECT_DIR, SMALL, job_env
from .jobs import read_metrics
from .local_slurm import local_slurm, slurm_unavailable_reason, wait_for_job

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[dict[str, str]]:
    if reason := slurm_unavailable_reason():
        pytest.skip(reason)
    with local_slurm(tmp_path_factory.mktemp("slurm")) as env:
        yield {**job_env(), **{k: v for k, v in env.items() if k.startswith("SLURM")}, "NPROC_PER_NODE": "2"}


def sbatch(env: dict[str, str], output: Path, *overrides: str) -> str:
    """Submit the project's script as a user would, Hydra overrides after it."""
    cmd = ["sbatch", "--parsable", "--nodes=1", "--time=10", f"--output={output}", "scripts/slurm.sbatch", *overrides]
    proc = subprocess.run(cmd, cwd=PROJECT_DIR, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def show_job(job_id: str, env: dict[str, str]) -> str:
    return subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True).stdout


def diagnose(job_id: str, env: dict[str, str]) -> str:
    log = Path(env["SLURM_CONF"]).parent / "log" / "slurmctld.log"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:]) if log.is_file() else ""
    return f"\n--- scontrol show job\n{show_job(job_id, env)}\n--- slurmctld.log\n{tail}"


def run_dir_of(job_id: str) -> Path:
    return PROJECT_DIR / "outputs" / f"slurm_{job_id}"


def test_sbatch_trains_with_one_torchrun_per_node(slurm, tmp_path) -> None:
    output = tmp_path / "job.out"
    job_id = sbatch(slurm, output, *SMALL, "trainer.epochs=1", "data.train_size=256")
    try:
        state = wait_for_job(job_id, slurm, timeout=240)
        log = output.read_text()
        assert state == "COMPLETED", log[-3000:] + diagnose(job_id, slurm)
        assert f"job {job_id}, restart 0: 1 node(s), rendezvous" in log
        assert "world size 2" in log
        assert read_metrics(run_dir_of(job_id))[-1]["kind"] == "val"
    finally:
        shutil.rmtree(run_dir_of(job_id), ignore_errors=True)


def test_sigterm_checkpoints_and_the_job_requeues_and_resumes(slurm, tmp_path) -> None:
    output = tmp_path / "job.out"
    job_id = sbatch(slurm, output, *SMALL, "trainer.epochs=3", "data.train_size=2048", "checkpoint.every_n_steps=0")
    run_dir = run_dir_of(job_id)
    try:
        deadline = time.monotonic() + 180
        while not list((run_dir / "checkpoints").glob("step_*.pt")):
            assert time.monotonic() < deadline, output.read_text()[-3000:] if output.exists() else "no output"
            time.sleep(0.5)
        # What Slurm does before the time limit (--signal=TERM@120): SIGTERM to the job's steps.
        subprocess.run(["scancel", "--signal=TERM", job_id], env=slurm, check=True)
        # The requeued job starts again by itself after the cluster's cred_expire (5 s in tests/e2e/local_slurm.py).
        deadline = time.monotonic() + 240
        while "final: val_loss=" not in (log := output.read_text()):
            assert time.monotonic() < deadline, log[-3000:] + diagnose(job_id, slurm)
            time.sleep(1)
        assert wait_for_job(job_id, slurm, timeout=60) == "COMPLETED"
        assert "stopped by SIGTERM with a checkpoint saved: requeueing job" in log
        assert f"job {job_id}, restart 1:" in log
        rank0 = (run_dir / "logs" / "rank_0.log").read_text()
        assert "stopped by SIGTERM after step" in rank0 and "resumed from" in rank0
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def test_a_sweep_runs_each_point_as_its_own_slurm_job_and_a_resubmission_trains_nothing(slurm, tmp_path) -> None:
    """-m SUBMIT=slurm: one sbatch per point, the launcher waits and gathers results.md; launched again on the
    same SWEEP_DIR, the finished points are not submitted again."""
    sweep_dir = tmp_path / "sweep"
    command = ["bash", "scripts/run_single.sh", "-m", "SUBMIT=slurm", f"SWEEP_DIR={sweep_dir}",
               "SUBMIT_ARGS=--nodes=1 --time=10", *SMALL, "trainer.epochs=1", "data.train_size=128",
               "optim.lr=0.05,0.1"]  # fmt: skip
    first = subprocess.run(command, cwd=PROJECT_DIR, env=slurm, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    jobs = re.findall(r"submitted as job (\d+)", first.stdout)
    assert len(jobs) == 2 and len(set(jobs)) == 2, first.stdout
    results = (sweep_dir / "results.md").read_text()
    rows = [line for line in results.splitlines() if line.startswith("| 0 ") or line.startswith("| 1 ")]
    assert len(rows) == 2 and all(" done " in row for row in rows), results
    for job in jobs:
        assert f"job {job}, restart 0: 1 node(s)" in next(sweep_dir.glob(f"*/slurm_{job}.out")).read_text()
    again = subprocess.run(command, cwd=PROJECT_DIR, env=slurm, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "submitted as job" not in again.stdout, again.stdout[-3000:]
    assert again.stdout.count("done before, not submitted again") == 2
    assert (sweep_dir / "results.md").read_text() == results

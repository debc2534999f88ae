"""scripts/slurm.sbatch on a real Slurm of two hosts played on this machine: two slurmd, each in a network
namespace of its own with its own address, one slurmctld (tests/e2e/local_slurm.py, two_node_slurm).
The script as written (two nodes) trains with one torchrun per node over the namespaces' addresses; a
SIGTERM checkpoints, the job requeues itself and resumes on both nodes, which end with the same weights.
A sweep with SUBMIT=slurm runs each point as its own (one-node) job, and a re-submission trains nothing."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from ..helpers import PROJECT_DIR, SMALL, job_env
from .jobs import fingerprints, read_metrics
from .local_slurm import slurm_unavailable_reason, two_node_slurm, wait_for_job

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> Iterator[tuple[dict[str, str], tuple[str, ...]]]:
    if reason := slurm_unavailable_reason():
        pytest.skip(reason)
    try:
        cluster = two_node_slurm(tmp_path_factory.mktemp("slurm2"))
        env, where = cluster.__enter__()
    except RuntimeError as error:
        pytest.skip(f"no two-host Slurm here: {str(error).splitlines()[0]}")
    try:
        yield {**job_env(), **{k: v for k, v in env.items() if k.startswith("SLURM")}, "NPROC_PER_NODE": "1"}, where
    finally:
        cluster.__exit__(None, None, None)


def test_sbatch_trains_on_two_nodes_and_a_requeue_after_sigterm_resumes_on_both(two_nodes, tmp_path) -> None:
    env, where = two_nodes
    output = tmp_path / "job.out"
    overrides = [*SMALL, "trainer.epochs=3", "data.train_size=1536", "checkpoint.every_n_steps=0"]
    command = [*where, "sbatch", "--parsable", "--time=10", f"--output={output}", "scripts/slurm.sbatch", *overrides]
    submitted = subprocess.run(command, cwd=PROJECT_DIR, env=env, capture_output=True, text=True)  # as a user submits
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    run_dir = PROJECT_DIR / "outputs" / f"slurm_{job_id}"
    try:
        deadline = time.monotonic() + 240
        while not list((run_dir / "checkpoints").glob("step_*.pt")):
            assert time.monotonic() < deadline, output.read_text()[-3000:] if output.exists() else "no output"
            time.sleep(0.5)
        subprocess.run([*where, "scancel", "--signal=TERM", job_id], env=env, check=True)  # Slurm's --signal=TERM@120
        deadline = time.monotonic() + 300
        while "final: val_loss=" not in (log := output.read_text()):
            assert time.monotonic() < deadline, log[-3000:]
            time.sleep(1)
        assert wait_for_job(job_id, env, timeout=60, where=where) == "COMPLETED", log[-3000:]
        first = log.split("restart 1:")[0]
        assert f"job {job_id}, restart 0: 2 node(s), rendezvous 10." in first, log[-3000:]
        assert "stopped by SIGTERM with a checkpoint saved: requeueing job" in log
        assert f"job {job_id}, restart 1: 2 node(s)" in log and "world size 2" in log
        prints = fingerprints(run_dir)
        assert set(prints) == {"rank_0", "rank_1"} and len(set(prints.values())) == 1, prints
        rank1 = (run_dir / "logs" / "rank_1.log").read_text()
        assert "stopped by SIGTERM after step" in rank1 and "resumed from" in rank1
        assert read_metrics(run_dir)[-1]["kind"] == "val"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def test_a_sweep_runs_each_point_as_its_own_slurm_job_and_a_resubmission_trains_nothing(two_nodes, tmp_path) -> None:
    """-m SUBMIT=slurm: one sbatch per point, the launcher waits and gathers results.md; launched again on the
    same SWEEP_DIR, the finished points are not submitted again."""
    slurm, where = two_nodes
    sweep_dir = tmp_path / "sweep"
    command = [*where, "bash", "scripts/run_single.sh", "-m", "SUBMIT=slurm", f"SWEEP_DIR={sweep_dir}",
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

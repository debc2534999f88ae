"""scripts/slurm.sbatch on a real Slurm of two hosts played on this machine: two slurmd, each in a network
namespace of its own with its own address, one slurmctld (tests/e2e/local_slurm.py, two_node_slurm).
The script as written (two nodes) trains with one torchrun per node over the namespaces' addresses; a
SIGTERM checkpoints, the job requeues itself and resumes on both nodes, which end with the same weights."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from ..helpers import PROJECT_DIR, SMALL
from .jobs import fingerprints, read_metrics
from .local_slurm import slurm_for_tests, wait_for_job

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> Iterator[tuple[dict[str, str], tuple[str, ...]]]:
    yield from slurm_for_tests(tmp_path_factory)


def test_sbatch_trains_on_two_nodes_and_a_requeue_after_sigterm_resumes_on_both(two_nodes, tmp_path) -> None:
    env, where = two_nodes
    output = tmp_path / "job.out"
    # 32x32 images: steps slow enough that Slurm's SIGTERM lands before the last epoch ends.
    overrides = [*SMALL, "data.image_size=32", "trainer.epochs=3", "data.train_size=1536", "checkpoint.every_n_steps=0"]
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
        # Slurm signals torchrun and the launcher passes it on too: the second, ignored, prints no traceback
        assert "Logging error" not in log and "Traceback" not in log, log[-3000:]
        assert f"job {job_id}, restart 1: 2 node(s)" in log and "world size 2" in log
        prints = fingerprints(run_dir)
        assert set(prints) == {"rank_0", "rank_1"} and len(set(prints.values())) == 1, prints
        rank1 = (run_dir / "logs" / "rank_1.log").read_text()
        assert "stopped by SIGTERM after step" in rank1 and "resumed from" in rank1
        assert read_metrics(run_dir)[-1]["kind"] == "val"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)

"""A sweep with SUBMIT=slurm on a real Slurm of two hosts (tests/e2e/local_slurm.py): each point its own
(one-node) job, waited for and gathered in results.md; a re-submission trains nothing."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import pytest

from ..helpers import PROJECT_DIR, SMALL
from .local_slurm import slurm_for_tests

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> Iterator[tuple[dict[str, str], tuple[str, ...]]]:
    yield from slurm_for_tests(tmp_path_factory)


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

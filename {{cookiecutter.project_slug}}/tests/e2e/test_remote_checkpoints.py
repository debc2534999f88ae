"""checkpoint.dir=s3://... against a real S3 API on 127.0.0.1 (moto's server), the way a job on
machines without a shared disk uses it: killed, relaunched elsewhere on an empty disk, resumed bit for
bit; another run given the same prefix refused; resumed on another world size with every sample once;
the store lost during a save."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.engine.checkpoint.store import CheckpointStore

from ..helpers import SMALL, run
from .jobs import assert_bit_identical, finish, start, steps_saved, wait_for

pytestmark = pytest.mark.slow

# 1024 samples, 32 a batch, 2 processes: 16 steps an epoch; a checkpoint every 4 steps.
JOB = [*SMALL, "trainer.epochs=2", "checkpoint.every_n_steps=4", "checkpoint.keep_last=2",
       "trainer.record_samples=true"]  # fmt: skip
LAST_STEP = 32


def store_steps(url: str) -> list[int]:
    return [int(re.findall(r"\d+", name)[0]) for name in CheckpointStore(url, retry_s=5).names()]


def audit(run_dir: Path, up_to_step: int) -> dict[int, list[int]]:
    """Each epoch's sample indices over every rank, of the steps up to `up_to_step`."""
    seen: dict[int, list[int]] = {}
    for path in (run_dir / "logs").glob("samples_rank_*.jsonl"):
        for record in map(json.loads, path.read_text().splitlines()):
            if record["step"] <= up_to_step:
                seen.setdefault(record["epoch"], []).extend(record["indices"])
    return seen


def every_file_text(root: Path) -> str:
    return "".join(path.read_bytes().decode("latin-1") for path in root.rglob("*") if path.is_file())


def test_a_job_killed_resumes_from_the_store_on_an_empty_disk_at_any_world_size(s3_server, tmp_path: Path) -> None:
    bucket = s3_server.bucket()
    reference = tmp_path / "reference"
    code, output = finish(start(reference, 2, *JOB))
    assert code == 0 and steps_saved(reference)[-1] == LAST_STEP, output[-3000:]

    # A node's job, killed outright (SIGKILL to all of it) after its second checkpoint went up.
    url, killed = f"{bucket}/run", tmp_path / "killed"
    proc = start(killed, 2, *JOB, f"checkpoint.dir={url}")
    wait_for(lambda: any(step >= 8 for step in store_steps(url)), "a checkpoint of step 8 in the store")
    os.killpg(proc.pid, signal.SIGKILL)
    finish(proc)
    saved = max(store_steps(url))
    assert saved < LAST_STEP, "killed mid-run"
    logs = tmp_path / "killed_copy"
    shutil.copytree(killed / "logs", logs / "logs")
    shutil.rmtree(killed)  # the machine is gone: nothing of the run is left on any local disk
    fs = s3_server.filesystem()
    fs.copy(f"{url.removeprefix('s3://')}/", f"{bucket.removeprefix('s3://')}/copy/", recursive=True)
    fs.rm(f"{bucket.removeprefix('s3://')}/copy/.owner")  # a copy handed to another run (remote_checkpoints.md)

    # Another run given the same prefix (a new run dir) is refused in one line, before any work.
    code, output = finish(start(tmp_path / "intruder", 2, *JOB, f"checkpoint.dir={url}"))
    assert code == 2 and f"error: checkpoint.dir={url} belongs to the run in {killed} (its .owner says so), " \
        f"not to this one in {tmp_path / 'intruder'}: " in output, output[-3000:]  # fmt: skip
    assert not list((tmp_path / "intruder").glob("checkpoints/step_*")) and max(store_steps(url)) == saved

    # Relaunched elsewhere (the same RUN_DIR, an empty disk): the newest checkpoint comes down, bit for bit.
    again = killed
    code, output = finish(start(again, 2, *JOB, f"checkpoint.dir={url}"))
    assert code == 0, output[-3000:]
    assert f"resumed from {again / 'checkpoints' / f'step_{saved:08d}.pt'}" in output
    # brought down by the workers' start checks, then the local copy of the store's newest (remote_checkpoints.md)
    assert f"the store (the store's newest: {url}/step_{saved:08d}.pt)" in output, output[-3000:]
    assert_bit_identical(reference, again, LAST_STEP)
    assert store_steps(url) == [LAST_STEP, LAST_STEP - 4], "keep_last=2 in the store"

    # The same checkpoint on 3 processes: every sample of the epoch once, before the kill and after. The
    # job as it was (2 epochs): the kill may come after epoch 0's end, and a finished run trains nothing.
    three = tmp_path / "three"
    code, output = finish(start(three, 3, *JOB, f"checkpoint.dir={bucket}/copy"))
    assert code == 0 and "saved by 2 processes, now 3" in output, output[-3000:]
    if saved < 16:  # the kill came in the first epoch: it is the one split between the two runs
        before, after = audit(logs, saved).get(0, []), audit(three, 10**9).get(0, [])
        assert sorted(before + after) == list(range(1024)), "each sample of epoch 0 exactly once"

    # A fully sharded job's checkpoints go up too (each rank its shards, trainer.pt last) and come back.
    sharded, sharded_url = tmp_path / "sharded", f"{bucket}/sharded"
    fsdp = [*JOB, "strategy=fsdp", "trainer.epochs=1", f"checkpoint.dir={sharded_url}"]
    code, output = finish(start(sharded, 2, *fsdp))
    assert code == 0 and store_steps(sharded_url)[0] == 16, output[-3000:]
    assert fs.exists(f"{sharded_url.removeprefix('s3://')}/step_00000016/trainer.pt")
    shutil.rmtree(sharded)
    code, output = finish(start(sharded, 2, *fsdp[:-2], "trainer.epochs=2", f"checkpoint.dir={sharded_url}"))
    assert code == 0 and "resumed from" in output and store_steps(sharded_url)[0] == LAST_STEP, output[-3000:]

    # The store lost in the middle of a run: retried for checkpoint.store_retry_s, then one line.
    # Epochs to spare: the job must still be saving when the store goes, however slow the polling is.
    lost, lost_url = tmp_path / "lost", f"{bucket}/lost"
    proc = start(lost, 2, *JOB, "trainer.epochs=40", f"checkpoint.dir={lost_url}", "checkpoint.store_retry_s=3")
    wait_for(lambda: bool(store_steps(lost_url)), "a first checkpoint in the store")
    s3_server.stop()
    code, output = finish(proc)
    # The store may go during an upload or just after it, as the writer lists what to prune: either says so.
    failed = rf"checkpoint.dir={lost_url}: (saving step_\d+\.pt|listing the checkpoints|reading .owner) failed for 3 s"
    assert code != 0 and re.search(failed, output), output
    assert re.search(
        rf"the store could not be listed to say which checkpoint it holds \(the last one uploaded: "
        rf"{lost_url}/step_\d+\.pt\); the local copies in {lost / 'checkpoints'} stay",
        output,
    ), output
    for run_dir in (again, three, sharded, lost, tmp_path / "intruder"):
        assert s3_server.secret not in every_file_text(run_dir), f"a secret of the environment in {run_dir}"
    assert s3_server.secret not in output


def test_a_store_that_does_not_answer_is_one_line_before_torchrun(tmp_path: Path) -> None:
    proc = run(["bash", "scripts/run_single.sh", f"RUN_DIR={tmp_path / 'run'}", "checkpoint.dir=s3://no-bucket/run"],
               env={**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k",
                    "AWS_SECRET_ACCESS_KEY": "hush", "AWS_MAX_ATTEMPTS": "1"}, expect_ok=False)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: checkpoint.dir=s3://no-bucket/run: the store does not answer")
    assert proc.stderr.count("\n") == 1 and "hush" not in proc.stderr and "torch.distributed" not in proc.stdout
    assert not (tmp_path / "run").exists(), "nothing started"

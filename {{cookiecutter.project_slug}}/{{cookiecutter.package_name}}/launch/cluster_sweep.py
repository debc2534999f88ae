"""-m with SUBMIT=slurm: each point of a sweep its own Slurm job, `sbatch [SUBMIT_ARGS] scripts/slurm.sbatch
RUN_DIR=<the point's dir> <its overrides>`, all submitted at once; the launcher waits for them (squeue) and
gathers results.md as a local sweep does. A point whose run has finished is not submitted again, and one
whose job is still queued or running is waited for, not submitted twice: launching the sweep again with
the same SWEEP_DIR submits only what has not finished. Ctrl-C stops the waiting, not the jobs."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

from ..common.run_dir import FINISHED_MARKER
from .checks import preflight
from .job import last_evaluation
from .keys import LaunchError
from .plan import Launch

POLL_S = 2.0
STATUS_FILE = "sweep_point.json"


def slurm(*command: str) -> str:
    """A Slurm client command's output; one line where it fails."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True)
    except FileNotFoundError:
        raise LaunchError(f"SUBMIT=slurm: {command[0]} is not installed here: run the sweep on a login node") from None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise LaunchError(f"SUBMIT=slurm: {' '.join(command[:2])} failed: {said}")
    return done.stdout


def queued(job_ids: list[str]) -> set[str]:
    """Those of the jobs still in the queue (pending, running, or requeued)."""
    if not job_ids:
        return set()
    listed = slurm("squeue", "-h", "-o", "%i", "-j", ",".join(job_ids))
    return {line.split("_")[0].strip() for line in listed.splitlines() if line.strip()} & set(job_ids)


def cluster_sweep(launch: Launch, points: list[tuple[int, list[str], Path]]) -> list[dict]:
    """Submit the points that have not finished, wait for their jobs, and return every point's row."""
    options = shlex.split(launch.values["SUBMIT_ARGS"])
    rows, waiting = {}, {}
    for index, point, run_dir in points:
        status_file = run_dir / STATUS_FILE
        previous = json.loads(status_file.read_text()) if status_file.is_file() else {}
        if previous.get("status") == "done" or (run_dir / FINISHED_MARKER).is_file():
            print(f"point {index}: {' '.join(point)}: done before, not submitted again", flush=True)
            rows[index] = {**previous, "point": index, "overrides": point, "status": "done", "run_dir": str(run_dir),
                           "final": last_evaluation(run_dir) or previous.get("final", {})}  # fmt: skip
            continue
        if (job := previous.get("job")) and job in queued([job]):
            print(f"point {index}: {' '.join(point)}: job {job} still in the queue, waited for", flush=True)
        else:
            try:  # the point's config checked here, as a local sweep's is: not in a job that waited in the queue
                preflight(point, run_dir if run_dir.exists() else None, launch)
            except LaunchError as error:
                print(f"point {index}: {' '.join(point)}: error: {error}", flush=True)
                rows[index] = {"point": index, "overrides": point, "status": "failed", "reason": str(error),
                               "run_dir": str(run_dir), "final": {}}  # fmt: skip
                continue
            run_dir.mkdir(parents=True, exist_ok=True)
            output = slurm("sbatch", "--parsable", f"--job-name=sweep_{index:03d}", f"--output={run_dir}/slurm_%j.out",
                           *options, "scripts/slurm.sbatch", f"RUN_DIR={run_dir}", *point)  # fmt: skip
            job = output.strip().split(";")[0]
            print(f"point {index}: {' '.join(point)}: submitted as job {job}", flush=True)
        waiting[index] = job
        rows[index] = {"point": index, "overrides": point, "status": "submitted", "reason": "", "run_dir": str(run_dir),
                       "final": {}, "job": job}  # fmt: skip
        status_file.write_text(json.dumps(rows[index]) + "\n")
    told = 0.0
    while left := queued(list(waiting.values())):
        if time.monotonic() - told > 60:
            print(f"waiting for {len(left)} job(s): {' '.join(sorted(left))} (Ctrl-C stops waiting, not the jobs)",
                  flush=True)  # fmt: skip
            told = time.monotonic()
        time.sleep(POLL_S)
    for index, job in waiting.items():
        run_dir = Path(rows[index]["run_dir"])
        done = (run_dir / FINISHED_MARKER).is_file()
        reason = "" if done else f"job {job} ended unfinished: see {run_dir}/slurm_{job}.out"
        rows[index].update(status="done" if done else "failed", final=last_evaluation(run_dir) or {}, reason=reason)
        (run_dir / STATUS_FILE).write_text(json.dumps(rows[index]) + "\n")
    return [rows[index] for index, _, _ in points]

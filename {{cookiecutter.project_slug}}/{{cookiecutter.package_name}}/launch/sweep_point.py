"""A sweep's point as one training job (job.train) in its own run dir, recorded in its sweep_point.json:
a point done before is not trained again, one interrupted is."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .job import last_evaluation, train
from .keys import USER_ERROR_EXIT, LaunchArgs, LaunchError
from .plan import Launch
from .supervise import Forwarder


def run_point(
    launch: Launch, index: int, point: list[str], run_dir: Path, forwarder: Forwarder, **recorded: object
) -> dict:
    """One point of a sweep as its own torchrun job, unless it finished before; its table row
    (with `recorded`, kept in the run dir beside it)."""
    status_file = run_dir / "sweep_point.json"
    previous = json.loads(status_file.read_text()) if status_file.is_file() else {}
    if previous.get("status") == "done":
        print(f"point {index}: {' '.join(point)}: done before, not trained again", flush=True)
        return previous
    print(f"point {index}: {' '.join(point)}", flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    row = {"point": index, "overrides": point, "status": "running", "reason": "", "run_dir": str(run_dir),
           "final": {}, **recorded}  # fmt: skip
    status_file.write_text(json.dumps(row) + "\n")  # an interrupted point keeps its overrides: it resumes
    try:
        code = train(launch, LaunchArgs(overrides=point), run_dir, forwarder)
        reason = "" if code == 0 else f"exit code {code}"
    except LaunchError as error:
        code, reason = USER_ERROR_EXIT, str(error)
        print(f"error: {error}", file=sys.stderr, flush=True)
    status = "done" if code == 0 else ("stopped" if forwarder.signal else "failed")
    row.update(status=status, reason=reason, final=last_evaluation(run_dir) or {})
    status_file.write_text(json.dumps(row) + "\n")
    return row

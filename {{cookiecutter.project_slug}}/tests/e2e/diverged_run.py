"""What a diverged run leaves where the project names the samples behind it (engine/nonfinite.py), checked on
test_resume.py's diverged job: the record of the step's global batch, in the file the error line names."""

from __future__ import annotations

import json
from pathlib import Path


def check_diverged_run(run_dir: Path, step: int, cause: str, line: str) -> None:
    (record,) = [json.loads(text) for text in (run_dir / "nonfinite.jsonl").read_text().splitlines()]
    assert record["step"] == step and record["cause"] == cause, record
    assert len(record["indices"]) == 64 and f"trainer.skip_samples={run_dir / 'nonfinite.jsonl'}" in line, record

"""Items that do not stack, as users meet them: docs/configuration.md's variable-length example (its
data set, EmbeddingBag model and data.collate, copied as a user copies them) trained on 2 processes,
a worker killed mid-run and resumed bit for bit, evaluated at 1 and 2 processes alike."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from ..helpers import PROJECT_DIR, PYTHON, job_env
from .jobs import (
    assert_bit_identical,
    finish,
    last_line,
    project_copy,
    start,
    steps_saved,
    wait_for,
    worker_pid,
)

# 2 epochs of 32 steps on 2 processes; a checkpoint every step keeps the run going long enough to be
# killed in the middle.
JOB = ["trainer.epochs=2", "data.batch_size=8", "checkpoint.every_n_steps=1", "checkpoint.keep_last=100"]
LAST_STEP = 64


def docs_example() -> tuple[dict[str, str], list[str]]:
    """The files and the training command of docs/configuration.md's data.collate section."""
    text = (PROJECT_DIR / "docs" / "configuration.md").read_text()
    section = text.split("## Items that do not stack: data.collate", 1)[1].split("\n## ", 1)[0]
    files, command = {}, []
    for language, body in re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S):
        if language == "bash":
            command = body.splitlines()[0].split("#")[0].split()[2:]  # after `bash scripts/run_single.sh`
        else:
            name = body.splitlines()[0].removeprefix("# ")
            files[name] = body
    return files, command


@pytest.mark.slow
def test_variable_length_items_train_resume_bit_exactly_and_evaluate_alike_at_any_world_size(tmp_path: Path) -> None:
    project = project_copy(tmp_path / "project")
    files, command = docs_example()
    assert set(files) == {"my_tokens.py", "configs/model/bag.yaml", "configs/data/token_bags.yaml"}, files
    for name, content in files.items():
        (project / name).write_text(content)
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    # Side by side, and the evaluation beside the killed run's restart: most of a job is its processes' start.
    reference_job = start(reference, 2, *command, *JOB, cwd=project)
    killed_job = start(killed, 2, *command, *JOB, cwd=project)
    wait_for(lambda: 4 in steps_saved(killed), "the checkpoint of step 4")
    os.kill(worker_pid(killed, 1), signal.SIGKILL)
    code, reference_output = finish(reference_job)
    assert code == 0, reference_output[-3000:]
    last = f"ckpt_path={reference / 'checkpoints' / f'step_{LAST_STEP:08d}.pt'}"
    evaluation = subprocess.Popen([PYTHON, "eval.py", last], cwd=project, env=job_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
    code, output = finish(killed_job)
    assert code == 0 and "resumed from" in output, output[-3000:]
    assert int(re.findall(r"resumed from \S*step_(\d+)\.pt", output)[0]) < LAST_STEP, "killed in the middle"
    assert_bit_identical(reference, killed, step=LAST_STEP)

    # Evaluated on 2 processes at the end of each run, and on 1 by eval.py from the last checkpoint: the
    # same figures (eval.py on 2 processes is tests/e2e/test_training.py's; a job's start costs seconds).
    trained = {re.findall(r"final: (val_loss=.*)", text)[-1] for text in (reference_output, output)}
    stdout, stderr = evaluation.communicate(timeout=120)
    assert evaluation.returncode == 0, stderr[-3000:]
    assert trained == {last_line(stdout)}, (trained, stdout)
    assert float(re.findall(r"val_acc=([\d.]+)", stdout)[0]) > 0.6, "it learns from the padded batches"

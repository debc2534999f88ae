"""The open seam as users meet it: the README's own-model example."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from ..helpers import PROJECT_DIR
from .jobs import (
    assert_bit_identical,
    finish,
    project_copy,
    read_metrics,
    start,
    steps_saved,
    wait_for,
    worker_pid,
)

KILL_TEST = ["trainer.epochs=2", "checkpoint.every_n_steps=4", "checkpoint.keep_last=50"]


def readme_example() -> tuple[dict[str, str], list[list[str]]]:
    """The files and commands of the README's "Your own model and data", as a user copies them."""
    text = (PROJECT_DIR / "README.md").read_text()
    section = text.split("## Your own model and data", 1)[1].split("\n## ", 1)[0]
    files: dict[str, str] = {}
    commands: list[list[str]] = []
    for language, body in re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S):
        if language == "bash":
            commands += [line.split("#")[0].split()[2:] for line in body.splitlines() if line.startswith("bash ")]
            continue
        name = None
        for line in body.splitlines(keepends=True):
            if re.match(r"# [\w/]+\.(py|yaml)\b", line):
                name = line[2:].split(":")[0].split()[0]
                files[name] = ""
            files[name] += line  # type: ignore[index]
    return files, commands


@pytest.fixture(scope="module")
def own_project(tmp_path_factory) -> tuple[Path, list[list[str]]]:
    project = project_copy(tmp_path_factory.mktemp("own") / "project")
    files, commands = readme_example()
    assert set(files) == {"my_project.py", "configs/model/mlp.yaml", "configs/data/blobs.yaml"}, files
    for name, content in files.items():
        (project / name).write_text(content)
    return project, commands


@pytest.mark.slow
def test_readme_example_with_its_own_task_trains_reports_its_metrics_and_resumes_bit_identically(
    own_project, tmp_path: Path
) -> None:
    """The README's second command (its model, data and task, which adds the first's task; the first differs
    only by the default task, which every other job runs): the task's metric in the final line and the
    metrics, and a worker SIGKILLed mid-run resumes bit for bit, dropout included. (It was two tests, one job
    each way: a job's start costs seconds.) A torchvision model by one yaml file: the shipped resnets' files
    (configs/model/resnet18.yaml), trained and resumed in-process (tests/engine/test_trainer.py); a yaml file
    the user adds to configs/: this project's mlp.yaml."""
    project, commands = own_project
    assert commands[0][:2] == commands[1][:2] == ["model=mlp", "data=blobs"], commands
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    code, output = finish(start(reference, 2, *commands[1], *KILL_TEST, cwd=project))
    assert code == 0, output[-3000:]
    assert re.search(r"final: val_loss=[\d.]+ val_top2=[\d.]+ val_samples=512$", output, re.M), output[-3000:]
    final = read_metrics(reference)[-1]
    assert {"val_loss", "val_top2", "val_samples"} <= set(final) and final["val_top2"] > 0.9, final
    proc = start(killed, 2, *commands[1], *KILL_TEST, cwd=project)
    wait_for(lambda: 8 in steps_saved(killed), "the checkpoint of step 8")
    os.kill(worker_pid(killed, 1), signal.SIGKILL)
    code, output = finish(proc)
    assert code == 0 and "resumed from" in output, output[-3000:]
    assert_bit_identical(reference, killed, step=48)  # dropout draws resumed from the saved generator states


# A `_target_` that cannot work (no module, not a Module, a data set that is not a pair), refused in one line
# naming the key: tests/engine/assembly/test_checks.py, in-process; the pre-flight check's refusals through the
# launch script, exit 2 before torchrun: test_launch.py.

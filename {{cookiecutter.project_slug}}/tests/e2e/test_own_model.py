"""The open seam as users meet it: the README's own-model example, a torchvision model by one
yaml file."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from ..helpers import PROJECT_DIR, run
from .jobs import (
    assert_bit_identical,
    finish,
    last_line,
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
def test_readme_example_trains_and_resumes_bit_identically_with_dropout(own_project, tmp_path: Path) -> None:
    project, commands = own_project
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    code, output = finish(start(reference, 2, *commands[0], *KILL_TEST, cwd=project))
    assert code == 0, output[-3000:]
    records = read_metrics(reference)
    assert [r for r in records if r["kind"] == "val"][-1]["val_acc"] > 0.8, records[-1]
    proc = start(killed, 2, *commands[0], *KILL_TEST, cwd=project)
    wait_for(lambda: 8 in steps_saved(killed), "the checkpoint of step 8")
    os.kill(worker_pid(killed, 1), signal.SIGKILL)
    code, output = finish(proc)
    assert code == 0 and "resumed from" in output, output[-3000:]
    assert_bit_identical(reference, killed, step=48)  # dropout draws resumed from the saved generator states


@pytest.mark.slow
def test_readme_custom_task_reports_its_metrics(own_project, tmp_path: Path) -> None:
    project, commands = own_project
    proc = run(["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", f"RUN_DIR={tmp_path}", *commands[1],
                "trainer.epochs=1"], cwd=project)  # fmt: skip
    assert re.search(r"final: val_loss=[\d.]+ val_top2=[\d.]+ val_samples=512$", last_line(proc.stderr)), proc.stderr
    assert {"val_loss", "val_top2", "val_samples"} <= set(read_metrics(tmp_path)[-1])


@pytest.mark.slow
def test_a_torchvision_model_is_one_yaml_file(tmp_path: Path) -> None:
    project = project_copy(tmp_path / "project")
    (project / "configs" / "model" / "mobilenet.yaml").write_text(
        "_target_: torchvision.models.mobilenet_v3_small\nnum_classes: ${data.num_classes}\n"
    )
    run(["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", f"RUN_DIR={tmp_path / 'run'}", "model=mobilenet",
         "data=synthetic", "data.train_size=128", "data.val_size=32", "data.batch_size=16", "trainer.epochs=1"],
        cwd=project)  # fmt: skip
    assert read_metrics(tmp_path / "run")[-1]["kind"] == "val"


# A `_target_` that cannot work (no module, not a Module, a data set that is not a pair), refused in one line
# naming the key: tests/engine/assembly/test_checks.py, in-process; the pre-flight check's refusals through the
# launch script, exit 2 before torchrun: test_launch.py.

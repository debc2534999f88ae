"""common/run_dir.py: one run dir per job, shared by its ranks and its restarts; the markers; `.hydra/`."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

from {{cookiecutter.package_name}}.common.run_dir import (
    CONTROL_DIR_ENV,
    FAILED_MARKER,
    clear_markers,
    job_run_dir,
    read_marker,
    write_hydra_record,
    write_marker,
)

from ..helpers import compose_config


def test_run_dir_is_shared_by_the_ranks_and_restarts_of_a_job(monkeypatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc123")
    monkeypatch.setenv("RANK", "1")
    assert job_run_dir() == os.path.join("outputs", "torchrun_abc123")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert job_run_dir() == os.path.join("outputs", "torchrun_job")
    monkeypatch.delenv("RANK")
    assert job_run_dir().startswith(os.path.join("outputs", "20"))


def test_a_marker_reaches_the_launcher_through_its_control_dir_when_the_run_dir_cannot_take_it(
    tmp_path: Path, monkeypatch
) -> None:
    control, run_dir = tmp_path / "control", tmp_path / "run"
    control.mkdir()
    monkeypatch.setenv(CONTROL_DIR_ENV, str(control))
    assert write_marker(run_dir, FAILED_MARKER, "disk full\n1\n"), "the run dir does not exist: the control dir does"
    assert read_marker(run_dir, FAILED_MARKER, control) == "disk full\n1\n"
    assert not (run_dir / FAILED_MARKER).exists() and not list(control.glob("*.tmp"))
    run_dir.mkdir()
    assert write_marker(run_dir, FAILED_MARKER, "again\n")
    assert (run_dir / FAILED_MARKER).read_text() == "again\n", "both copies, for anyone watching the run dir"
    clear_markers(run_dir, control)
    assert read_marker(run_dir, FAILED_MARKER, control) is None
    monkeypatch.delenv(CONTROL_DIR_ENV)
    assert not write_marker(tmp_path / "gone", FAILED_MARKER, "x\n"), "nowhere to write: the caller says it itself"


def test_the_hydra_record_holds_the_config_and_overrides_without_their_secrets(tmp_path: Path) -> None:
    secret = "s3cr3t-pw"
    uri = f"http://alice:{secret}@tracking.example.com:5000"
    cfg = compose_config(["data=cifar10", "optim.lr=0.05", f"data.root={uri}"])
    overrides = ["optim.lr=0.05", f"data.root={uri}", "+my.api_key=abc123"]
    hydra_cfg = OmegaConf.create({"run": {"dir": str(tmp_path)}, "overrides": {"task": overrides}})  # Hydra's, in short
    write_hydra_record(tmp_path, cfg, hydra_cfg)
    texts = {path.name: path.read_text() for path in (tmp_path / ".hydra").iterdir()}
    assert set(texts) == {"config.yaml", "overrides.yaml", "hydra.yaml"}
    assert "lr: 0.05" in texts["config.yaml"] and "alice:***@tracking.example.com" in texts["config.yaml"]
    assert "optim.lr=0.05" in texts["overrides.yaml"] and "+my.api_key=***" in texts["overrides.yaml"]
    assert not any(secret in text or "abc123" in text for text in texts.values()), texts

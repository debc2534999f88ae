"""rundir.py: one run dir per job, shared by its ranks and its restarts."""

from __future__ import annotations

import os

from {{cookiecutter.package_name}}.rundir import job_run_dir, rank_zero_only


def test_run_dir_is_shared_by_the_ranks_and_restarts_of_a_job(monkeypatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc123")
    monkeypatch.setenv("RANK", "1")
    assert job_run_dir() == os.path.join("outputs", "torchrun_abc123")
    assert rank_zero_only(".hydra") is None
    monkeypatch.setenv("RANK", "0")
    assert rank_zero_only(".hydra") == ".hydra"
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    monkeypatch.delenv("RANK")
    assert job_run_dir().startswith(os.path.join("outputs", "20"))

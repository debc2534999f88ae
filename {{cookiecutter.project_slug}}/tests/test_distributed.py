"""The backend decision, the legacy --local-rank argument, the run dir, single-process helpers."""

from __future__ import annotations

import os

import pytest
import torch

from {{cookiecutter.package_name}} import distributed
from {{cookiecutter.package_name}}.config import ConfigError
from {{cookiecutter.package_name}}.distributed import choose_backend
from {{cookiecutter.package_name}}.entry import accept_legacy_local_rank
from {{cookiecutter.package_name}}.rundir import job_run_dir, rank_zero_only


@pytest.mark.parametrize(
    ("requested", "gpus", "local_ranks", "backend", "use_cuda", "shared"),
    [
        ("auto", 0, 2, "gloo", False, False),
        ("auto", 8, 8, "nccl", True, False),
        ("auto", 8, 4, "nccl", True, False),
        ("auto", 1, 4, "gloo", True, True),  # the single-GPU communication check
        ("gloo", 0, 3, "gloo", False, False),
        ("gloo", 2, 2, "gloo", True, False),
        ("nccl", 4, 4, "nccl", True, False),
    ],
)
def test_choose_backend(requested, gpus, local_ranks, backend, use_cuda, shared) -> None:
    choice = choose_backend(requested, gpus, local_ranks, mpi_available=False)
    assert (choice.backend, choice.use_cuda, choice.shared_gpus) == (backend, use_cuda, shared)


def test_nccl_with_fewer_gpus_than_ranks_names_both_counts() -> None:
    with pytest.raises(ConfigError, match=r"nproc_per_node=4 but only 1 visible GPU.*Duplicate GPU"):
        choose_backend("nccl", 1, 4, mpi_available=False)


def test_nccl_without_gpu_and_mpi_without_support_are_refused() -> None:
    with pytest.raises(ConfigError, match="needs a GPU"):
        choose_backend("nccl", 0, 1, mpi_available=False)
    with pytest.raises(ConfigError, match="without MPI; use dist.backend=gloo or nccl"):
        choose_backend("mpi", 0, 1, mpi_available=False)
    assert choose_backend("mpi", 0, 2, mpi_available=True).backend == "mpi"


@pytest.mark.parametrize(
    "argv",
    [
        ["train.py", "--local-rank=1", "trainer.epochs=2"],
        ["train.py", "--local_rank=1", "trainer.epochs=2"],
        ["train.py", "--local-rank", "1", "trainer.epochs=2"],
    ],
)
def test_legacy_local_rank_argument_is_accepted(argv, monkeypatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    accept_legacy_local_rank(argv)
    assert argv == ["train.py", "trainer.epochs=2"]
    assert os.environ["LOCAL_RANK"] == "1"


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


def test_helpers_answer_for_a_world_of_one() -> None:
    assert distributed.get_rank() == 0 and distributed.get_world_size() == 1
    assert distributed.is_main_process()
    value = torch.tensor([3.0])
    assert distributed.all_reduce_sum(value).item() == 3.0

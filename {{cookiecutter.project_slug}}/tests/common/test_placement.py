"""common/placement.py: the backend a job's processes use, decided once from the GPUs they see, and the GPUs
counted without torch (the launcher's way)."""

from __future__ import annotations

from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.common.placement import choose_backend, visible_gpu_count


@pytest.mark.parametrize(
    ("requested", "gpus", "local_ranks", "backend", "use_cuda", "shared"),
    [
        ("auto", 0, 2, "gloo", False, False),
        ("auto", 8, 8, "nccl", True, False),
        ("auto", 8, 4, "nccl", True, False),
        ("auto", 1, 4, "gloo", True, True),  # four processes on one GPU: they share it over gloo
        ("gloo", 0, 3, "gloo", False, False),
        ("gloo", 2, 2, "gloo", True, False),
        ("gloo", 1, 1, "gloo", True, False),  # gloo with CUDA tensors, one GPU each
        ("gloo", 1, 2, "gloo", True, True),
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


def test_visible_gpus_are_cuda_visible_devices_when_set_else_the_drivers_list(tmp_path: Path) -> None:
    driver = tmp_path / "gpus"
    driver.mkdir()
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (driver / bus).mkdir()  # one folder per GPU, as /proc/driver/nvidia/gpus
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "0,1"}, driver=driver) == 2, "the job's own list wins"
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "3, ,5,"}, driver=driver) == 2, "blank items are none"
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": ""}, driver=driver) == 0, "set but empty: no GPU"
    assert visible_gpu_count({}, driver=driver) == 3, "unset: every GPU the driver lists"

"""distributed.py: the backend decision, the helpers for a world of one, the ddp.* knobs reaching DDP."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from {{cookiecutter.package_name}} import distributed
from {{cookiecutter.package_name}}.config import ConfigError, to_train_config
from {{cookiecutter.package_name}}.distributed import choose_backend, wrap_ddp

from .helpers import compose_config, cpu_env


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


def test_helpers_answer_for_a_world_of_one() -> None:
    assert distributed.get_rank() == 0 and distributed.get_world_size() == 1
    assert distributed.is_main_process()
    value = torch.tensor([3.0])
    assert distributed.all_reduce_sum(value).item() == 3.0


def test_the_default_ddp_knobs_reach_ddp_where_ddps_own_defaults_differ() -> None:
    """tests/test_trainer.py sets each knob against the config's default; this is the other side:
    gradient_as_bucket_view=true (the config's default, not DDP's) is lost if wrap_ddp drops it."""
    config = to_train_config(compose_config()).ddp
    assert config.gradient_as_bucket_view, "the case this test is for"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # a real group of one
    try:
        ddp = wrap_ddp(nn.Linear(4, 2), config, cpu_env(0, 1))
        assert ddp.bucket_bytes_cap == config.bucket_cap_mb * 1024 * 1024
        knobs = ("gradient_as_bucket_view", "static_graph", "find_unused_parameters", "broadcast_buffers")
        assert {knob: getattr(ddp, knob) for knob in knobs} == {knob: getattr(config, knob) for knob in knobs}
    finally:
        dist.destroy_process_group()

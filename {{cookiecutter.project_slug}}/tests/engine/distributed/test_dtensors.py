"""engine/distributed/dtensors.py: a DTensor (a sharding strategy's parameters, gradients, norms) is told
from a plain tensor, on two ranks, and a rank's part of it is its own shard; asked in a process that never
imported torch.distributed.tensor, the answer does not import it."""

from __future__ import annotations

import subprocess

import torch

from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.engine.distributed.dtensors import is_sharded, local

from ...helpers import PYTHON, on_ranks


def shard_of_a_range(env: DistEnv) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    plain = torch.arange(6.0)
    sharded = distribute_tensor(plain, init_device_mesh("cpu", (env.world_size,)), [Shard(0)])
    return {"sharded": is_sharded(sharded), "plain": is_sharded(plain), "mine": local(sharded).tolist(),
            "same": local(plain) is plain}  # fmt: skip


def test_a_dtensor_is_told_apart_and_each_rank_holds_its_own_shard() -> None:
    ranks = on_ranks(2, shard_of_a_range)
    assert [rank["mine"] for rank in ranks] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert all(rank["sharded"] and not rank["plain"] and rank["same"] for rank in ranks), ranks


def test_asking_about_a_plain_tensor_imports_no_dtensor_module() -> None:
    probe = ("import sys, torch; from {{cookiecutter.package_name}}.engine.distributed.dtensors import is_sharded, local; "
             "t = torch.ones(2); assert not is_sharded(t) and local(t) is t; "
             "print('torch.distributed.tensor' in sys.modules)")  # fmt: skip
    printed = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert printed == "False"

"""strategy=ddp: every ddp.* knob of the config reaches DistributedDataParallel, and sync_batchnorm
converts the model of a real group."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly.build import prepare_model
from {{cookiecutter.package_name}}.engine.strategies import build_strategy
from {{cookiecutter.package_name}}.engine.strategies.ddp import wrap_ddp

from ...helpers import TINY, compose_config, cpu_env, trainer


def test_ddp_gets_every_knob_of_the_config(tmp_path: Path) -> None:
    knobs = {"bucket_cap_mb": 7, "gradient_as_bucket_view": False, "static_graph": True,
             "find_unused_parameters": True, "broadcast_buffers": False}  # fmt: skip
    defaults = compose_config(TINY).ddp
    assert all(defaults[key] != value for key, value in knobs.items()), "each knob is set against its default"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # a real group of one
    try:
        ddp = trainer(tmp_path, *(f"ddp.{key}={value}" for key, value in knobs.items())).runner.trained
        assert isinstance(ddp, DistributedDataParallel)
        assert ddp.bucket_bytes_cap == 7 * 1024 * 1024
        got = {key: getattr(ddp, key) for key in knobs if key != "bucket_cap_mb"}
        assert got == {key: value for key, value in knobs.items() if key != "bucket_cap_mb"}
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world_size", [1, 2])
def test_sync_batchnorm_converts_the_model_of_a_real_group(world_size: int) -> None:
    env = DistEnv(0, 0, world_size, world_size, "nccl", torch.device("cpu"))  # conversion needs no group
    config = to_train_config(compose_config([*TINY, "model=resnet18", "ddp.sync_batchnorm=true"]))
    model = prepare_model(config, env, build_strategy(config, env))
    norms = {type(m).__name__ for m in model.modules() if "BatchNorm" in type(m).__name__}
    assert norms == ({"SyncBatchNorm"} if world_size > 1 else {"BatchNorm2d"})


def test_the_default_ddp_knobs_reach_ddp_where_ddps_own_defaults_differ() -> None:
    """test_ddp_gets_every_knob_of_the_config sets each knob against the config's default; this is the
    other side: gradient_as_bucket_view=true (the config's default, not DDP's) is lost if wrap_ddp drops it."""
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

"""engine/strategies/hsdp.py: FSDP2 on a 2-D mesh, sharded within a node and replicated across nodes.
Four real gloo processes play two nodes of two (the launch of two nodes: tests/e2e/test_hsdp.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.engine.strategies import build_strategy

from ...helpers import SMALL, compose_config, on_ranks, train_one_epoch

# 192 samples, 8 per rank and step, 4 ranks: an epoch of 6 steps, a checkpoint at step 4.
JOB = [*SMALL, "strategy=hsdp", "model=small_cnn", "data.train_size=192", "data.val_size=16", "data.batch_size=8",
       "checkpoint.every_n_steps=4"]  # fmt: skip


def two_nodes_of_two(env: DistEnv) -> DistEnv:
    """This rank as a job of two nodes of two processes sees itself (LOCAL_WORLD_SIZE=2)."""
    return DistEnv(env.rank, env.rank % 2, env.world_size, 2, env.backend, env.device)


def train_kill_resume(env: DistEnv, run_dir: Path) -> dict:
    """An epoch uninterrupted, then a second trainer (a restarted job) that resumes from its step-4
    checkpoint: the mesh, one weight's local shard and placements, and both ends' weights."""
    env = two_nodes_of_two(env)
    config = to_train_config(compose_config(JOB))
    found: dict = {}
    for name in ("uninterrupted", "resumed"):
        trainer = build_trainer(config, env, run_dir)
        if name == "resumed":
            found["resumed_from"] = trainer.state.step
        train_one_epoch(trainer)
        found[name] = {key: tensor.clone() for key, tensor in trainer.strategy.full_weights().items()}
        weight = next(p for p in trainer.strategy.model.parameters() if p.dim() > 1 and p.shape[0] % 2 == 0)
        found["mesh"] = tuple(weight.device_mesh.shape), weight.device_mesh.mesh_dim_names
        found["placements"] = [type(placement).__name__ for placement in weight.placements]
        found["local"], found["full"] = weight.to_local().detach().clone(), weight.full_tensor().detach().clone()
    return found


@pytest.mark.slow
def test_four_ranks_as_two_nodes_shard_within_a_node_replicate_across_and_resume_bit_exactly(tmp_path: Path) -> None:
    ranks = on_ranks(4, train_kill_resume, tmp_path)
    first = ranks[0]
    assert first["mesh"] == ((2, 2), ("replicate", "shard")) and first["placements"] == ["Replicate", "Shard"]
    assert torch.equal(ranks[0]["local"], ranks[2]["local"]) and torch.equal(ranks[1]["local"], ranks[3]["local"]), (
        "the nodes are replicas: the same shard on rank r and r + 2"
    )
    assert torch.equal(torch.cat([ranks[0]["local"], ranks[1]["local"]]), first["full"]), "a node holds it whole"
    assert not torch.equal(ranks[0]["local"], ranks[1]["local"])
    assert first["resumed_from"] == 4 and first["uninterrupted"].keys() == first["resumed"].keys()
    for key, tensor in first["uninterrupted"].items():
        assert torch.equal(tensor, first["resumed"][key]), f"{key} after the resume"
    assert any("running_mean" in key for key in first["resumed"]), "the BatchNorm buffers are in the weights"


def switch_to_fsdp_and_back(env: DistEnv, tmp_path: Path) -> dict:
    """hsdp's step-4 checkpoint (two nodes of two) continued under fsdp (4 ranks, the same global batch),
    which saves step 5; that continued under hsdp on one node of four (hsdp.shard_size=2, a 2 x 2 mesh).
    Each leg's step, its first step once resumed, its mesh, and its validation loss at the epoch's end."""
    legs = [("hsdp", two_nodes_of_two(env), [], None), ("to_fsdp", env, ["strategy=fsdp", "checkpoint.every_n_steps=5"],
            ("hsdp", "step_00000004")), ("back", env, ["hsdp.shard_size=2"], ("to_fsdp", "step_00000005"))]  # fmt: skip
    found: dict = {}
    for name, leg_env, overrides, source in legs:
        if source is not None and env.rank == 0:
            (tmp_path / name / "checkpoints").mkdir(parents=True)
            folder = tmp_path / source[0] / "checkpoints" / source[1]
            shutil.copytree(folder, tmp_path / name / "checkpoints" / source[1])
        torch.distributed.barrier()
        trainer = build_trainer(to_train_config(compose_config([*JOB, *overrides])), leg_env, tmp_path / name)
        resumed_from = trainer.state.step
        train_one_epoch(trainer)
        weight = next(p for p in trainer.strategy.model.parameters() if p.dim() > 1)
        found[name] = {"resumed_from": resumed_from, "step": trainer.state.step, "loss": trainer.validate().loss,
                       "mesh": tuple(weight.device_mesh.shape)}  # fmt: skip
    return found


@pytest.mark.slow  # three trainers on four ranks: in place of two 4-process jobs of tests/e2e/test_hsdp.py
def test_an_hsdp_checkpoint_continues_under_fsdp_and_fsdps_under_hsdp(tmp_path: Path) -> None:
    legs = on_ranks(4, switch_to_fsdp_and_back, tmp_path)[0]
    assert [legs[name]["resumed_from"] for name in ("hsdp", "to_fsdp", "back")] == [0, 4, 5]
    assert all(leg["step"] == 6 for leg in legs.values()), legs
    assert legs["hsdp"]["mesh"] == legs["back"]["mesh"] == (2, 2) and legs["to_fsdp"]["mesh"] == (4,)
    for name in ("to_fsdp", "back"):  # the same steps, up to the order of the sums
        assert legs[name]["loss"] == pytest.approx(legs["hsdp"]["loss"], rel=1e-3), (name, legs)


@pytest.mark.parametrize(
    ("world", "local", "shard_size", "refused"), [(4, 2, 0, False), (4, 2, 3, True), (6, 3, 2, False)]
)
def test_the_shard_size_is_a_nodes_processes_unless_set_and_must_divide_the_world(world, local, shard_size, refused):
    config = to_train_config(compose_config([*JOB, f"hsdp.shard_size={shard_size}"]))
    strategy = build_strategy(config, DistEnv(0, 0, world, local, "gloo", torch.device("cpu")))
    if refused:
        with pytest.raises(ConfigError) as error:
            strategy.check(use_cuda=False)
        assert str(error.value) == (f"hsdp.shard_size={shard_size} does not divide the {world} ranks into shard "
                                    "groups: give a divisor of the world size (0: each node's processes)")  # fmt: skip
        return
    strategy.check(use_cuda=False)
    assert strategy.shard_size() == (shard_size or local)
    assert (
        strategy.describe_mesh()
        == f"over {strategy.shard_size()} ranks, replicated {world // strategy.shard_size()} times"
    )


@pytest.mark.parametrize(("world", "local"), [(3, 2), (3, 1)])
def test_nodes_of_different_sizes_are_refused_on_every_node_alike(world, local, monkeypatch) -> None:
    """NNODES=2 launched with NPROC_PER_NODE=2 on one node and 1 on the other: 3 ranks. Each node refuses
    at once, whatever its own size (the one of 1 would divide the world and wait for the other)."""
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")  # as torchrun tells its workers
    config = to_train_config(compose_config(JOB))
    with pytest.raises(ConfigError) as error:
        build_strategy(config, DistEnv(0, 0, world, local, "gloo", torch.device("cpu"))).check(use_cuda=False)
    assert str(error.value) == (
        f"hsdp shards over each node's processes, and the nodes were launched with different numbers of them "
        f"(3 processes on 2 nodes, {local} on this one): give every node the same NPROC_PER_NODE, or set "
        "hsdp.shard_size"
    )
    build_strategy(config, DistEnv(0, 0, 4, 2, "gloo", torch.device("cpu"))).check(use_cuda=False)  # even nodes
    given = to_train_config(compose_config([*JOB, "hsdp.shard_size=1"]))  # a shard size set: any node sizes
    build_strategy(given, DistEnv(0, 0, world, local, "gloo", torch.device("cpu"))).check(use_cuda=False)


def test_hsdp_options_are_fsdps_and_ddp_options_are_refused_under_it() -> None:
    with pytest.raises(ConfigError, match="ddp.bucket_cap_mb=1.0 is a DDP option, and strategy=hsdp does not use it"):
        to_train_config(compose_config([*JOB, "ddp.bucket_cap_mb=1"]))
    with pytest.raises(ConfigError, match="hsdp.shard_size=2 is a HSDP option, and strategy=fsdp does not use it"):
        to_train_config(compose_config([*JOB, "strategy=fsdp", "hsdp.shard_size=2"]))
    to_train_config(compose_config([*JOB, "fsdp.reshard_after_forward=false"]))  # fsdp's section: hsdp's too


def test_hsdp_keeps_fsdps_checks_with_the_jobs_own_devices() -> None:
    config = to_train_config(compose_config([*JOB, "fsdp.cpu_offload=true"]))
    strategy = build_strategy(config, DistEnv(0, 0, 4, 2, "gloo", torch.device("cpu")))
    with pytest.raises(ConfigError, match="^fsdp.cpu_offload=true moves the shards off the GPUs"):
        strategy.check(use_cuda=False)
    strategy.check(use_cuda=True)  # on GPUs, offloading is what it is for

"""strategy=fsdp in one process: the refusals before any work, the blocks sharded, bf16 from fp32
shards, the bytes a rank holds (benchmarks/fsdp_memory.py's figures); on two ranks, a run switched to
ddp and back, each way resumed with the weights and the optimizer's state it was saved with. The
sharded checkpoints: tests/engine/checkpoint/test_sharded.py; the jobs themselves (2 processes,
killed, resumed): e2e/test_fsdp.py."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.engine.checkpoint.files import load_checkpoint
from {{cookiecutter.package_name}}.engine.checkpoint.sharded import read_whole
from {{cookiecutter.package_name}}.engine.strategies.fsdp import FSDP, per_rank_bytes

from ...helpers import TINY, assert_same, compose_config, cpu_env, on_ranks, run
from ..assembly.test_activation import Blocks

# An image classifier of three repeated blocks in a ModuleList (8x8 images): what fsdp shards one by one.
BLOCKS = [*TINY, "data.image_size=8", f"model._target_={Blocks.__module__}.Blocks"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("ddp.comm_hook=powersgd", "ddp.comm_hook=powersgd is a DDP option, and strategy=fsdp does not use it"),
        ("ddp.bucket_cap_mb=50", "ddp.bucket_cap_mb=50"),
        ("ddp.sync_batchnorm=true", "ddp.sync_batchnorm=True is a DDP option"),
        ("trainer.precision=fp16", "use trainer.precision=bf16"),
    ],
)
def test_what_fsdp_cannot_do_is_refused_in_one_line(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        to_train_config(compose_config(["strategy=fsdp", override]))
    assert "\n" not in str(error.value)
    to_train_config(compose_config(["strategy=ddp", override]))  # all fine under ddp


def test_cpu_offload_without_gpus_is_refused_before_any_work() -> None:
    config = to_train_config(compose_config(["strategy=fsdp", "fsdp.cpu_offload=true"]))
    with pytest.raises(ConfigError) as error:
        FSDP(config, cpu_env(0, 2)).check(use_cuda=False)
    assert str(error.value) == ("fsdp.cpu_offload=true moves the shards off the GPUs, and this job runs on CPUs, "
                                "where they are already: drop it (or run on GPUs)")  # fmt: skip
    FSDP(config, cpu_env(0, 2)).check(use_cuda=True)


def test_the_launch_script_refuses_a_ddp_option_under_fsdp_before_torchrun(tmp_path: Path) -> None:
    proc = run(["bash", "scripts/run_single.sh", f"RUN_DIR={tmp_path / 'run'}", "strategy=fsdp", "ddp.comm_hook=fp16"],
               expect_ok=False)  # fmt: skip
    assert proc.returncode == 2 and "torchrun" not in proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ddp.comm_hook=fp16 is a DDP option")
    assert not (tmp_path / "run").exists()


def test_fsdp_blocks_under_ddp_is_taken_for_activation_checkpointing_only() -> None:
    refused = r"fsdp.blocks=\['Block'\] is a FSDP option, and strategy=ddp does not use it"
    with pytest.raises(ConfigError, match=refused):
        to_train_config(compose_config(["strategy=ddp", "fsdp.blocks=[Block]"]))
    recomputed = ["strategy=ddp", "fsdp.blocks=[Block]", "trainer.activation_checkpointing=true"]
    config = to_train_config(compose_config(recomputed))
    assert config.fsdp.blocks == ["Block"]


def test_the_blocks_sharded_are_fsdp_blocks_classes_else_the_automatic_ones_and_the_log_says_which(
    tmp_path: Path, caplog
) -> None:
    import torch.distributed as dist

    from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer

    caplog.set_level("INFO")
    small, blocks = ["strategy=fsdp", *TINY], ["strategy=fsdp", *BLOCKS]
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # fsdp's mesh needs a group
    try:
        for index, overrides in enumerate([[*blocks, "fsdp.blocks=[Linear]"], blocks, small]):
            build_trainer(to_train_config(compose_config(overrides)), cpu_env(0, 1), tmp_path / str(index))
    finally:
        dist.destroy_process_group()
    said = [record.getMessage() for record in caplog.records if " blocks sharded " in record.getMessage()]
    assert len(said) == 3 and re.fullmatch(r"fsdp: \d+ blocks sharded \(Linear\) over 1 ranks, then the root", said[0])
    assert int(said[0].split()[1]) > 3, "each Linear of the 3 blocks, not the blocks; named as fsdp.blocks names them"
    assert said[1:] == ["fsdp: 3 blocks sharded (Block) over 1 ranks, then the root",
                        "fsdp: 0 blocks sharded (none) over 1 ranks, then the root"]  # fmt: skip


def test_bf16_under_fsdp_computes_in_bf16_from_fp32_shards_and_reduces_the_loss_in_fp32(tmp_path: Path) -> None:
    import torch.distributed as dist

    from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer

    overrides = ["strategy=fsdp", "trainer.precision=bf16", *BLOCKS]
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # fsdp's mesh needs a group
    try:
        trainer = build_trainer(to_train_config(compose_config(overrides)), cpu_env(0, 1), tmp_path)
        seen = {}
        layer = trainer.model.blocks[0].net[1]
        layer.register_forward_pre_hook(lambda module, args: seen.update(weight=module.weight.dtype, x=args[0].dtype))
        trainer.model.register_forward_hook(lambda module, args, output: seen.update(logits=output.dtype))
        inputs, targets, weights, _ = next(iter(trainer.data.train_loader))
        trainer.runner.micro_step(inputs, targets, weights, real_samples=len(weights), sync=True)
        assert seen == {"weight": torch.bfloat16, "x": torch.bfloat16, "logits": torch.float32}, seen
        assert trainer.runner.dtype is None, "no autocast: the policy casts"
        assert layer.weight.to_local().dtype == torch.float32 and layer.weight.grad.dtype == torch.float32
    finally:
        dist.destroy_process_group()


def test_the_bytes_held_are_counted_per_tensor_by_its_element_size_gradients_and_optimizer_state_apart() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2, dtype=torch.float64))
    optimizer = torch.optim.Adam(model.parameters())
    assert per_rank_bytes(model, optimizer) == {"parameters": 15 * 4 + 8 * 8, "gradients": 0, "optimizer": 0}
    model[0].weight.grad = torch.ones_like(model[0].weight)  # the others' stay None: nothing held for them
    optimizer.step()  # Adam's state for that one alone: step (a 0-d fp32 tensor), exp_avg, exp_avg_sq
    assert per_rank_bytes(model, optimizer) == {"parameters": 124, "gradients": 12 * 4, "optimizer": 4 + 2 * 12 * 4}


# small_cnn (BatchNorm) on 2 ranks, 8 samples each a step: an epoch of 6 steps, checkpoints at steps 4 and 6.
SWITCH = [*TINY, "model=small_cnn", "data.batch_size=8", "trainer.epochs=1", "checkpoint.every_n_steps=4"]


def held(trained) -> dict:
    """What rank 0 holds of a trainer, gathered whole: its weights and buffers, and each parameter's
    momentum, by name."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    whole = get_optimizer_state_dict(trained.strategy.model, trained.optimizer, options=options)
    state = whole.get("state", {})  # rank 0's alone
    return {"weights": {key: tensor.clone() for key, tensor in trained.strategy.full_weights().items()},
            "momentum": {name: values["momentum_buffer"].clone() for name, values in state.items()}}  # fmt: skip


def switch_to_ddp_and_back(env: DistEnv, tmp_path: Path) -> dict:
    """An fsdp epoch (step 4 saved sharded), continued from step 4 under ddp (which saves step 5 as a
    .pt), that continued from step 5 under fsdp: each leg's hold once resumed, its first step, its
    checkpoints and its validation loss at the epoch's end; and the order ddp's optimizer numbers the
    parameters in (its .pt's optimizer state is keyed by those numbers)."""
    legs = [("fsdp", ["strategy=fsdp"], None), ("to_ddp", ["strategy=ddp", "checkpoint.every_n_steps=5"],
            ("fsdp", "step_00000004")), ("back", ["strategy=fsdp"], ("to_ddp", "step_00000005.pt"))]  # fmt: skip
    found: dict = {}
    for name, overrides, source in legs:
        if source is not None and env.rank == 0:
            (tmp_path / name / "checkpoints").mkdir(parents=True)
            copy = shutil.copytree if source[0] == "fsdp" else shutil.copy
            copy(tmp_path / source[0] / "checkpoints" / source[1], tmp_path / name / "checkpoints" / source[1])
        torch.distributed.barrier()
        trained = build_trainer(to_train_config(compose_config([*SWITCH, *overrides])), env, tmp_path / name)
        found[name] = {"resumed_from": trained.state.step, "held": held(trained)}
        if name == "to_ddp":
            names = {parameter: key for key, parameter in trained.strategy.model.named_parameters()}
            found["order"] = [names[p] for group in trained.optimizer.param_groups for p in group["params"]]
        loss = trained.fit().loss
        saved = sorted(path.name for path in (tmp_path / name / "checkpoints").glob("step_*"))
        found[name].update(step=trained.state.step, loss=loss, saved=saved)
    return found


@pytest.mark.slow  # three trainers on two ranks: in place of two 2-process jobs of tests/e2e/test_fsdp.py
def test_a_run_switches_to_ddp_and_back_each_resumed_with_its_weights_and_optimizer_state(tmp_path: Path) -> None:
    legs = on_ranks(2, switch_to_ddp_and_back, tmp_path)[0]
    assert [legs[name]["resumed_from"] for name in ("fsdp", "to_ddp", "back")] == [0, 4, 5]
    sharded = read_whole(tmp_path / "fsdp" / "checkpoints" / "step_00000004")
    momentum = {name: values["momentum_buffer"] for name, values in sharded["optimizer"]["state"].items()}
    assert_same(legs["to_ddp"]["held"], {"weights": sharded["model"], "momentum": momentum}, "ddp from shards")
    plain = load_checkpoint(tmp_path / "to_ddp" / "checkpoints" / "step_00000005.pt")
    numbered = plain["optimizer"]["state"].items()  # torch.optim's numbers, in ddp's order of the parameters
    momentum = {legs["order"][number]: values["momentum_buffer"] for number, values in numbered}
    assert_same(legs["back"]["held"], {"weights": plain["model"], "momentum": momentum}, "fsdp from a .pt")
    assert legs["to_ddp"]["saved"] == ["step_00000004", "step_00000005.pt", "step_00000006.pt"], "ddp saves .pt"
    assert legs["back"]["saved"] == ["step_00000005.pt", "step_00000006"], "and fsdp its shards again"
    for name in ("to_ddp", "back"):  # fsdp and ddp sum gradients in other orders: close, not identical
        assert legs[name]["step"] == 6
        assert legs[name]["loss"] == pytest.approx(legs["fsdp"]["loss"], rel=1e-4), (name, legs[name]["loss"])

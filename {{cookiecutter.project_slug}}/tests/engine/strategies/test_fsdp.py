"""strategy=fsdp in one process: the refusals before any work, the blocks sharded, bf16 from fp32
shards, the bytes a rank holds (benchmarks/fsdp_memory.py's figures). The sharded checkpoints:
tests/engine/checkpoint/test_sharded.py; the jobs themselves (2 and 3 processes, killed, resumed):
e2e/test_fsdp.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torchvision

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import FSDPConfig, to_train_config
from {{cookiecutter.package_name}}.engine.strategies.fsdp import FSDP, find_blocks, per_rank_bytes
from {{cookiecutter.package_name}}.models import GPT, SmallCNN

from ...helpers import compose_config, cpu_env, run


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


def test_the_blocks_are_the_repeated_units_or_the_named_classes() -> None:
    gpt = GPT(block_size=8, layers=3, width=16, heads=2)
    assert find_blocks(gpt, []) == list(gpt.blocks)
    resnet = torchvision.models.resnet18()
    assert find_blocks(resnet, []) == [resnet.layer1, resnet.layer2, resnet.layer3, resnet.layer4]
    assert len(find_blocks(resnet, ["BasicBlock"])) == 8
    assert find_blocks(SmallCNN(num_classes=3), []) == []  # the root only
    assert FSDPConfig(blocks=[], reshard_after_forward=True, cpu_offload=False).blocks == []
    with pytest.raises(ConfigError) as error:  # a typo would shard nothing block by block: the whole model at once
        find_blocks(gpt, ["Blok"])
    assert str(error.value).startswith("fsdp.blocks=['Blok'] names no class GPT has: name its repeated blocks' ")
    assert "(it has Block, " in str(error.value)
    assert find_blocks(gpt, ["Block", "Bottleneck"]) == list(gpt.blocks), "a list for several models"


def test_fsdp_blocks_under_ddp_is_taken_for_activation_checkpointing_only() -> None:
    refused = r"fsdp.blocks=\['Block'\] is a FSDP option, and strategy=ddp does not use it"
    with pytest.raises(ConfigError, match=refused):
        to_train_config(compose_config(["strategy=ddp", "fsdp.blocks=[Block]"]))
    recomputed = ["strategy=ddp", "fsdp.blocks=[Block]", "trainer.activation_checkpointing=true"]
    config = to_train_config(compose_config(recomputed))
    assert config.fsdp.blocks == ["Block"]


def test_bf16_under_fsdp_computes_in_bf16_from_fp32_shards_and_reduces_the_loss_in_fp32(tmp_path: Path) -> None:
    import torch.distributed as dist

    from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer

    overrides = ["task=language_model", "strategy=fsdp", "trainer.precision=bf16", "model.width=32",
                 "model.layers=1", "data.train_samples=24", "data.val_samples=10"]  # fmt: skip
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # fsdp's mesh needs a group
    try:
        trainer = build_trainer(to_train_config(compose_config(overrides)), cpu_env(0, 1), tmp_path)
        seen = {}
        layer = trainer.model.blocks[0].attention.qkv
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

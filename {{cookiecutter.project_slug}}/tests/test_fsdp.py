"""strategy=fsdp in one process: the refusals before any work, the blocks sharded, the safe loader
of sharded checkpoints. The jobs themselves (2 and 3 processes, killed, resumed) are in e2e/test_fsdp.py."""

from __future__ import annotations

import pickle
import re
import subprocess
from pathlib import Path

import pytest
import torch
import torchvision

from {{cookiecutter.package_name}}.config import ConfigError, FSDPConfig, to_train_config
from {{cookiecutter.package_name}}.fsdp import check_offload, find_blocks
from {{cookiecutter.package_name}}.models import GPT, SmallCNN
from {{cookiecutter.package_name}}.sharded_checkpoint import MetadataUnpickler, SafeReader, read_whole

from .helpers import PYTHON, compose_config, cpu_env, run


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
    with pytest.raises(ConfigError, match=r"fsdp\.cpu_offload=true moves the shards off the GPUs.*drop it"):
        check_offload(config, use_cuda=False)
    check_offload(config, use_cuda=True)


def test_an_unknown_strategy_is_refused() -> None:
    with pytest.raises(ConfigError, match="strategy='zero3' is not one of ddp, fsdp"):
        to_train_config(compose_config(["strategy=zero3"]))


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


def test_bf16_under_fsdp_computes_in_bf16_from_fp32_shards_and_reduces_the_loss_in_fp32(tmp_path: Path) -> None:
    import torch.distributed as dist

    from {{cookiecutter.package_name}}.trainer import build_trainer

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


@pytest.mark.slow
def test_a_sharded_checkpoint_round_trips_in_a_world_of_one(tmp_path: Path) -> None:
    """fsdp over one process (python train.py strategy=fsdp): the folder of shards holds the trained
    weights, read back whole; a ddp run of the same job trains the same weights."""
    job = ["task=classification", "model=small_cnn", "data=synthetic", "data.train_size=64", "data.val_size=20",
           "data.batch_size=16", "trainer.epochs=1", "checkpoint.every_n_steps=2"]  # fmt: skip
    runs = {}
    for strategy in ("fsdp", "ddp"):
        run_dir = tmp_path / strategy
        proc = run([PYTHON, "train.py", f"hydra.run.dir={run_dir}", f"strategy={strategy}", *job])
        runs[strategy] = re.findall(r"sha256 (\w+)", proc.stdout + proc.stderr)[-1]
    folder = tmp_path / "fsdp" / "checkpoints" / "step_00000004"
    whole = read_whole(folder)
    ddp = torch.load(tmp_path / "ddp" / "checkpoints" / "step_00000004.pt", weights_only=True)
    for name, tensor in ddp["model"].items():
        assert torch.allclose(whole["model"][name], tensor, atol=1e-6), name
    assert set(whole["optimizer"]["state"]) == {name for name, _ in SmallCNN(num_classes=10).named_parameters()}


def test_the_shards_metadata_is_read_without_running_code(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(tmp_path / "pwned")],))

    folder = tmp_path / "step_00000001"
    folder.mkdir()
    (folder / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(pickle.UnpicklingError, match="subprocess.call is not part of a checkpoint's metadata"):
        SafeReader(folder).read_metadata()
    assert not (tmp_path / "pwned").exists()
    with open(folder / ".metadata", "rb") as file, pytest.raises(pickle.UnpicklingError):
        MetadataUnpickler(file).load()

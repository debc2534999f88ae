"""strategy=fsdp in one process: the refusals before any work, the blocks sharded, bf16 from fp32
shards, the bytes a rank holds (benchmarks/fsdp_memory.py's figures); on two ranks, a run switched to
ddp and back, each way resumed with the weights and the optimizer's state it was saved with; a step of
the (total, count) loss with accumulation, clipping and EMA that is the plain computation (each strategy's
step of each form: tests/engine/test_exact_losses.py); a validation in lock step; buffers resumed on
another world size, bit for bit, each sample once. The sharded checkpoints:
tests/engine/checkpoint/test_sharded.py; the jobs themselves (2 processes, killed, resumed): e2e/test_fsdp.py."""

from __future__ import annotations

import json
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
from {{cookiecutter.package_name}}.engine.evaluate import EvalResult
from {{cookiecutter.package_name}}.engine.strategies.fsdp import FSDP, per_rank_bytes

from ...helpers import SMALL, TINY, assert_same, compose_config, cpu_env, on_ranks, run, train_stop_resume
from ..assembly.test_activation import Blocks
from ..test_exact_losses import one_step, plain_gradient
from ..test_trainer import assert_resumed_on_two_ranks

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


def test_activation_checkpointing_recomputes_the_classes_fsdp_blocks_names_under_ddp(caplog) -> None:
    from {{cookiecutter.package_name}}.engine.assembly.build import prepare_model
    from {{cookiecutter.package_name}}.engine.strategies import build_strategy

    caplog.set_level("INFO")
    named = [*BLOCKS, "strategy=ddp", "fsdp.blocks=[Sequential]", "trainer.activation_checkpointing=true"]
    config = to_train_config(compose_config(named))
    prepare_model(config, cpu_env(0, 1), build_strategy(config, cpu_env(0, 1)))
    assert "activation checkpointing: 4 blocks (Sequential)" in caplog.text, "the stem and each block's net, named"


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


# --- a step of tests/engine/test_exact_losses.py's (total, count) form, clipped, with an EMA


CLIP, DECAY = 0.1, 0.5  # the gradient's norm is 0.41: clipped to a quarter; the average half way


def pair_loss_clipped_with_ema(env) -> list[torch.Tensor]:  # noqa: ANN001
    return one_step(env, "tokens", 2, "fsdp", clip=CLIP, decay=DECAY)


@pytest.mark.slow
def test_a_pair_loss_under_fsdp_with_accumulation_clipping_and_ema_is_the_plain_computation() -> None:
    """The (total, count) loss's gradient is rescaled to the global count before clipping: clipping then
    sees the true gradient's norm, and the EMA averages the weights that step made (a rescale after the
    clip, or the local count in place of the global one, moves every figure)."""
    plain = plain_gradient("tokens", 2)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in plain]))
    assert norm > 2 * CLIP, "clipping acts"
    clipped = [g * (CLIP / (norm + 1e-6)) for g in plain]  # clip_grad_norm_'s coefficient
    ranks = on_ranks(2, pair_loss_clipped_with_ema, timeout=180)
    moved, averaged = ranks[0][: len(plain)], ranks[0][len(plain) :]
    assert relative_error(moved, clipped) < 1e-4  # float32: the moves are weight differences; a wrong scale: > 0.1
    assert relative_error(averaged, [(1 - DECAY) * g for g in clipped]) < 1e-4  # w0 + (1 - decay) * (w1 - w0)
    assert all(torch.equal(a, b) for a, b in zip(ranks[0], ranks[1], strict=True)), "every rank the same"


def relative_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """|got - want| / |want| over all the tensors at once (elementwise, the tiniest entries' rounding dominates)."""
    flat_got, flat_want = torch.cat([g.flatten() for g in got]), torch.cat([w.flatten() for w in want])
    return float(torch.linalg.vector_norm(flat_got - flat_want) / torch.linalg.vector_norm(flat_want))


# --- validation: every forward gathers the shards


def fsdp_validation(env, run_dir) -> EvalResult:  # noqa: ANN001
    """5 samples in batches of 2 on 2 ranks: rank 0 has 2 batches, rank 1 one, and every forward gathers
    the shards, so the trainer must validate in lock step (a filler forward on rank 1) or hang."""
    overrides = [*SMALL, "data.image_size=32", "strategy=fsdp", "data.train_size=16", "data.val_size=5",
                 "data.batch_size=2"]  # fmt: skip
    return build_trainer(to_train_config(compose_config(overrides)), env, run_dir).validate()


@pytest.mark.slow
def test_validation_under_fsdp_runs_as_many_forwards_on_every_rank_and_counts_each_sample_once(tmp_path) -> None:
    first, second = on_ranks(2, fsdp_validation, tmp_path, timeout=60)
    assert first == second and first.samples == 5 and first.metrics["loss"] > 0


# --- buffers, and a resume on another world size


def samples_so_far(trained) -> list[dict]:
    audit = trained.run_dir / "logs" / f"samples_rank_{trained.env.rank}.jsonl"
    return [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []


def loaded(trained) -> dict:
    """What a rank holds once it has resumed, before any step, and the samples recorded by then."""
    return {"buffers": {key: buffer.clone() for key, buffer in trained.model.named_buffers()},
            "weights": {key: tensor.clone() for key, tensor in trained.strategy.full_weights().items()},
            "recorded": len(samples_so_far(trained))}  # fmt: skip


def continue_on_another_world_size(env: DistEnv, run_dir: Path, overrides: list[str]) -> dict:
    """train_stop_resume's two trainers on this world size, from a checkpoint of step 4 that another
    world size saved: what every rank holds once it has resumed, the samples each run trained on, both
    ends. The first saves step 5 (every_n_steps=5), so the second resumes from this world size's."""
    ends = train_stop_resume(env, run_dir, [*overrides, "checkpoint.every_n_steps=5"], samples_so_far, loaded)
    ends["samples"] = {name: ends[f"{name}_extra"][ends[f"{name}_before"]["recorded"] :]
                       for name in ("uninterrupted", "resumed")}  # fmt: skip
    ends["loaded"], ends["loaded_buffers"] = (ends["uninterrupted_before"][key] for key in ("weights", "buffers"))
    return ends


@pytest.mark.slow
def test_a_model_with_buffers_resumes_under_fsdp_on_another_world_size_bit_exactly_each_sample_once(
    tmp_path: Path,
) -> None:
    """small_cnn's BatchNorm statistics under fsdp: on 2 ranks as ddp's (tests/engine/test_trainer.py);
    saved by 2 ranks at step 4 and resumed on 3 (docs/checkpoints.md, "Buffers"), every rank starts from
    the checkpoint's weights and buffers, bit for bit; the epoch's samples are each trained on once, before
    the change and after; and a 3-rank run killed after its own checkpoint (step 5) ends bit-identical to
    the uninterrupted one."""
    job = ["strategy=fsdp", "model=small_cnn", "trainer.record_samples=true"]
    two, three = tmp_path / "two", tmp_path / "three"
    (two / "logs").mkdir(parents=True)
    before = on_ranks(2, train_stop_resume, two, job)  # fsdp gives rank 0's buffers after each step
    assert_resumed_on_two_ranks(before)
    assert_same(before[1]["resumed_buffers"], before[0]["resumed_buffers"], "rank 1's buffers (rank 0's)")
    (three / "checkpoints").mkdir(parents=True)
    shutil.copytree(two / "checkpoints" / "step_00000004", three / "checkpoints" / "step_00000004")
    (three / "logs").mkdir()
    ranks = on_ranks(3, continue_on_another_world_size, three, job)
    saved = read_whole(three / "checkpoints" / "step_00000004")["model"]
    assert_same(ranks[0]["loaded"], saved, "rank 0's weights and buffers once resumed on 3")
    buffers = {key: saved[key] for key in ranks[0]["loaded_buffers"]}
    for rank in ranks:
        assert_same(rank["loaded_buffers"], buffers, "every rank's buffers once resumed on 3")
    audit = [json.loads(line) for rank in range(2) for line in
             (two / "logs" / f"samples_rank_{rank}.jsonl").read_text().splitlines()]  # fmt: skip
    first = [index for record in audit if record["step"] <= 4 for index in record["indices"]]
    after = [index for rank in ranks for record in rank["samples"]["uninterrupted"] for index in record["indices"]]
    assert sorted(first + after) == list(range(96)), "each sample of the epoch exactly once"
    redone = [record for rank in ranks for record in rank["samples"]["resumed"]]
    again = [record for rank in ranks for record in rank["samples"]["uninterrupted"] if record["step"] == 6]
    assert {record["step"] for record in redone} == {6} and redone == again, "step 6 again, the same samples"
    ends = ranks[0]
    assert ends["uninterrupted_step"] == ends["resumed_step"] == 6
    assert_same(ends["resumed"], ends["uninterrupted"], "the resumed 3-rank run's weights and buffers")
    assert not any(torch.equal(ends["resumed"][key], buffers[key]) for key in buffers), "trained on 3"

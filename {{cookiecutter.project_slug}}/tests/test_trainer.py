"""The Trainer in this process (a world of one, no process group): its state, its loop's units."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from {{cookiecutter.package_name}}.config import ConfigError, to_train_config
from {{cookiecutter.package_name}}.distributed import DistEnv
from {{cookiecutter.package_name}}.fsdp import full_state_dict
from {{cookiecutter.package_name}}.preemption import StopOnSigterm
from {{cookiecutter.package_name}}.rundir import FINISHED_MARKER, STOPPED_MARKER
from {{cookiecutter.package_name}}.trainer import Trainer, build_trainer, optimizer_steps, prepare_model

from .helpers import SMALL, compose_config, on_ranks

CPU = DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, backend="gloo", device=torch.device("cpu"))
TINY = [*SMALL, "data.train_size=96", "data.val_size=16"]


def trainer(run_dir: Path, *overrides: str) -> Trainer:
    return build_trainer(to_train_config(compose_config([*TINY, *overrides])), CPU, run_dir)


def assert_same(a: object, b: object, where: str = "state") -> None:
    """Equal nested states: tensors bit for bit, everything else by ==."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{index}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def test_load_state_dict_is_the_exact_inverse_of_state_dict(tmp_path: Path) -> None:
    trained = trainer(tmp_path / "a")
    stop = StopOnSigterm()
    try:
        trained.train_epoch(stop)  # momentum buffers, counters and generator states that are not fresh
    finally:
        stop.close()
    saved = trained.state_dict()
    assert saved["step"] == 3 and saved["samples_in_epoch"] == 96 and saved["optimizer"]["state"]
    resumed = trainer(tmp_path / "b")
    resumed.load_state_dict(saved, "memory")
    assert_same(resumed.state_dict(), saved)


def test_a_checkpoint_of_a_newer_format_is_refused_in_one_line(tmp_path: Path) -> None:
    saved = trainer(tmp_path / "a").state_dict()
    with pytest.raises(ConfigError, match=r"format version 99, newer than this code's 1: update the project's code"):
        trainer(tmp_path / "b").load_state_dict({**saved, "format_version": 99}, "step_5.pt")


@pytest.mark.parametrize(("accum", "counts", "reals"), [(1, [1] * 4, [24, 24, 24, 8]), (3, [3, 1], [72, 8])])
def test_optimizer_steps_group_the_micro_batches_of_the_epoch(tmp_path: Path, accum, counts, reals) -> None:
    sampler = trainer(tmp_path, "data.train_size=80", "data.batch_size=24").data.sampler
    sampler.set_epoch(0)
    batches = iter(range(10))  # stands in for the loader: more than the epoch holds
    steps = list(optimizer_steps(batches, sampler, accum))
    assert [step.count for step in steps] == counts and [step.real_samples for step in steps] == reals
    assert next(batches) == 0, "lazy: nothing is read before its step is trained"


def test_each_epoch_trains_in_its_own_order(tmp_path: Path) -> None:
    """The classic forgotten `sampler.set_epoch`: without it every epoch repeats the first's order."""
    (tmp_path / "logs").mkdir()  # setup_logging makes it in a real run
    run = trainer(tmp_path, "trainer.record_samples=true", "data.batch_size=8", "data.train_size=64")
    stop = StopOnSigterm()
    try:
        for _ in range(2):
            run.train_epoch(stop)
            run.end_epoch()
    finally:
        stop.close()
    records = [json.loads(line) for line in (tmp_path / "logs" / "samples_rank_0.jsonl").read_text().splitlines()]
    orders = {epoch: [i for r in records if r["epoch"] == epoch for i in r["indices"]] for epoch in (0, 1)}
    assert sorted(orders[0]) == sorted(orders[1]) == list(range(64)), "every sample once per epoch"
    assert orders[0] != orders[1]


@pytest.mark.parametrize(("precision", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", None)])
@pytest.mark.parametrize("channels_last", [True, False])
def test_precision_and_memory_layout_reach_the_forward(tmp_path: Path, precision, dtype, channels_last) -> None:
    run = trainer(tmp_path, f"trainer.precision={precision}", f"trainer.channels_last={channels_last}")
    seen = {}

    def look(module, args) -> None:
        seen["autocast"] = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        seen["inputs"] = args[0].is_contiguous(memory_format=torch.channels_last)

    run.model.register_forward_pre_hook(look)
    first = next(iter(run.data.train_loader))
    run.runner.micro_step(*first[:3], real_samples=len(first[0]), sync=True)
    conv = next(p for p in run.model.parameters() if p.dim() == 4)
    assert seen == {"autocast": dtype, "inputs": channels_last}
    assert conv.is_contiguous(memory_format=torch.channels_last) == channels_last


def test_compile_wraps_the_model_that_trains_and_leaves_the_checkpointed_one_plain(tmp_path: Path) -> None:
    from torch._dynamo.eval_frame import OptimizedModule

    compiled, plain = trainer(tmp_path / "a", "trainer.compile=true"), trainer(tmp_path / "b")
    assert isinstance(compiled.runner.ddp_model, OptimizedModule)
    assert compiled.runner.ddp_model._orig_mod is compiled.model
    assert not isinstance(plain.runner.ddp_model, OptimizedModule)
    assert not any(key.startswith("_orig_mod.") for key in compiled.state_dict()["model"])


def test_ddp_gets_every_knob_of_the_config(tmp_path: Path) -> None:
    knobs = {"bucket_cap_mb": 7, "gradient_as_bucket_view": False, "static_graph": True,
             "find_unused_parameters": True, "broadcast_buffers": False}  # fmt: skip
    defaults = compose_config(TINY).ddp
    assert all(defaults[key] != value for key, value in knobs.items()), "each knob is set against its default"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # a real group of one
    try:
        ddp = trainer(tmp_path, *(f"ddp.{key}={value}" for key, value in knobs.items())).runner.ddp_model
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
    norms = {type(m).__name__ for m in prepare_model(config, env).modules() if "BatchNorm" in type(m).__name__}
    assert norms == ({"SyncBatchNorm"} if world_size > 1 else {"BatchNorm2d"})
{%- if cookiecutter.tensorboard == "yes" %}


def test_tensorboard_can_be_switched_off(tmp_path: Path) -> None:
    sinks = {flag: [type(sink).__name__ for sink in trainer(tmp_path / flag, f"log.tensorboard={flag}").metrics.sinks]
             for flag in ("true", "false")}  # fmt: skip
    assert "TensorBoardLog" in sinks["true"] and "TensorBoardLog" not in sinks["false"]
    assert (tmp_path / "true" / "tb").is_dir() and not (tmp_path / "false" / "tb").exists()
{%- endif %}


def train_stop_resume(env: DistEnv, run_dir: Path, overrides: list[str]) -> dict:
    """One epoch of 6 steps with a checkpoint at step 4, then a second trainer (a restarted job)
    that resumes from it and trains steps 5 and 6: both ends, and every rank's buffers after step 6."""
    config = to_train_config(compose_config([*TINY, "data.train_size=96", "data.batch_size=8",
                                             "checkpoint.every_n_steps=4", *overrides]))  # fmt: skip
    ends = {}
    for name in ("uninterrupted", "resumed"):
        trained = build_trainer(config, env, run_dir)
        stop = StopOnSigterm()
        try:
            trained.train_epoch(stop)
        finally:
            stop.close()
        trained.checkpoints.wait()
        ends[name] = {key: tensor.clone() for key, tensor in full_state_dict(trained.model).items()}
        ends[f"{name}_step"] = trained.state.step
        ends[f"{name}_buffers"] = {key: buffer.clone() for key, buffer in trained.model.named_buffers()}
    return ends


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_model_with_buffers_resumes_bit_exactly_on_two_ranks(tmp_path: Path, strategy: str) -> None:
    """small_cnn's BatchNorm statistics: every rank holds rank 0's after each step (ddp broadcasts them
    at the next forward, fsdp after the step), and a resume gives every rank rank 0's, not another's."""
    ranks = on_ranks(2, train_stop_resume, tmp_path, [f"strategy={strategy}", "model=small_cnn"])
    ends = ranks[0]
    assert ends["uninterrupted_step"] == ends["resumed_step"] == 6
    assert_same(ends["resumed"], ends["uninterrupted"], "the resumed run's weights and buffers")
    if strategy == "fsdp":
        assert_same(ranks[1]["resumed_buffers"], ends["resumed_buffers"], "rank 1's buffers (rank 0's)")


def test_fit_trains_validates_and_checkpoints_every_epoch_then_says_it_has_finished(tmp_path: Path, caplog) -> None:
    caplog.set_level("INFO")
    run = trainer(tmp_path, "trainer.epochs=2", "checkpoint.every_n_steps=2", "checkpoint.keep_last=10")
    result = run.fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    validations = [record for record in records if record["kind"] == "val"]
    assert [(r["epoch"], r["step"]) for r in validations] == [(0, 3), (1, 6)], "one validation per epoch, at its end"
    assert validations[-1]["val_loss"] == result.loss and result.samples == 16
    saved = sorted(path.name for path in (tmp_path / "checkpoints").glob("step_*.pt"))
    assert saved == ["step_00000002.pt", "step_00000003.pt", "step_00000004.pt", "step_00000006.pt"]
    assert (tmp_path / FINISHED_MARKER).read_text() == "6\n"
    again = trainer(tmp_path, "trainer.epochs=2", "checkpoint.every_n_steps=2", "checkpoint.keep_last=10")
    assert again.fit() == result and again.state.step == 6, "nothing trained again, the same evaluation"
    assert "training had already finished at step 6; evaluating" in caplog.text


def test_a_stop_signal_checkpoints_the_step_and_says_which_signal(tmp_path: Path) -> None:
    import os
    import signal

    from {{cookiecutter.package_name}}.preemption import Preempted

    run = trainer(tmp_path, "trainer.epochs=2", "checkpoint.every_n_steps=0")
    step = run.train_step

    def step_then_signal(*args) -> None:  # SIGTERM arrives during the second step
        step(*args)
        if run.state.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    run.train_step = step_then_signal
    with pytest.raises(Preempted, match="stopped by SIGTERM after step 2; checkpoint saved") as stopped:
        run.fit()
    assert stopped.value.exit_code == 143 and (tmp_path / STOPPED_MARKER).read_text() == "15\n"
    assert [path.name for path in (tmp_path / "checkpoints").glob("step_*.pt")] == ["step_00000002.pt"]
    assert not (tmp_path / FINISHED_MARKER).exists()

"""data.global_batch_size: the per-process batch and the accumulation derived for each world size, a size
that does not divide refused in one line (by the launcher and the workers), and a run resumed on other
world sizes that takes the steps, and the samples of each, of the uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.config.batches import apply_global_batch, split_global_batch
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.launch.checks import checked_config
from {{cookiecutter.package_name}}.launch.keys import LaunchError

from ..helpers import STRATEGIES, check_launch_for, compose_config, on_ranks, planned, train_one_epoch

# 100 samples in global batches of 12: 9 steps, the last of 4 (split 4 / 2+2 / 2+1+1 over 1, 2, 3 ranks);
# a checkpoint every 3 steps, where a stage stops.
# Named, not the bake's defaults (a bake may default to another model, data set or task).
BASE = ["task=classification", "model=small_cnn", "data=synthetic"]
JOB = [*BASE, "data.train_size=100", "data.val_size=8", "data.image_size=8", "data.global_batch_size=12",
       "model._target_=tests.config.test_batches.TinyNet", "model.width=16", "scheduler=constant",
       "scheduler.warmup_epochs=0", "trainer.log_every_n_steps=1", "checkpoint.every_n_steps=3"]  # fmt: skip


class TinyNet(nn.Sequential):
    """No state per rank (no BatchNorm statistics, no dropout): what a global batch keeps at any world size."""

    def __init__(self, num_classes: int, width: int) -> None:
        super().__init__(nn.Flatten(), nn.Linear(3 * 8 * 8, width), nn.ReLU(), nn.Linear(width, num_classes))


# (world size, data.micro_batch_size, the derived (batch per process, accumulation)) of a global batch of 12
SPLITS = [(1, None, (12, 1)), (2, None, (6, 1)), (3, None, (4, 1)), (1, 4, (4, 3)), (2, 4, (3, 2)), (3, 4, (4, 1)),
          (2, 5, (3, 2)), (4, 1, (1, 3))]  # fmt: skip


@pytest.mark.parametrize(("world_size", "micro", "expected"), SPLITS)
def test_the_batch_and_accumulation_make_the_global_batch_within_the_micro_cap(world_size, micro, expected) -> None:
    batch, accum = split_global_batch(12, micro, world_size)
    assert (batch, accum) == expected and batch * accum * world_size == 12 and batch <= (micro or 12)


def test_a_world_size_that_does_not_divide_the_global_batch_names_those_that_do() -> None:
    with pytest.raises(ConfigError) as error:
        split_global_batch(256, None, 3)
    assert str(error.value) == (
        "data.global_batch_size=256 does not split evenly among 3 processes: run on 1, 2, 4, 8, 16, 32, 64, 128 "
        "processes, or give a global batch that 3 divides (e.g. 255 or 258)"
    )


def test_without_a_global_batch_the_configured_batch_and_accumulation_stay() -> None:
    config = to_train_config(compose_config([*BASE, "data.batch_size=7", "trainer.grad_accum_steps=3"]))
    apply_global_batch(config, 4)
    assert (config.data.global_batch_size, config.data.batch_size, config.trainer.grad_accum_steps) == (None, 7, 3)


def test_a_micro_batch_cap_without_a_global_batch_is_refused() -> None:
    with pytest.raises(ConfigError, match="data.micro_batch_size caps the per-process share"):
        to_train_config(compose_config([*BASE, "data.micro_batch_size=4"]))


def test_the_launcher_refuses_a_global_batch_its_processes_do_not_divide_before_torchrun() -> None:
    with pytest.raises(LaunchError, match="data.global_batch_size=12 does not split evenly among 5 processes"):
        checked_config([*BASE, "data.global_batch_size=12"], planned("single", "NPROC_PER_NODE=5"))
    with pytest.raises(LaunchError, match="among 10 processes: run on"):  # NNODES=1:2 may run on 5 or 10
        elastic = planned("multi", "NPROC_PER_NODE=5", "NNODES=1:2", "NODE_RANK=0", "MASTER_ADDR=127.0.0.1")
        checked_config([*BASE, "data.global_batch_size=15"], elastic)
    checked_config([*BASE, "data.global_batch_size=10"], planned("single", "NPROC_PER_NODE=5"))


def test_a_worker_refuses_a_global_batch_its_world_does_not_divide_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not split evenly among 5 processes"):
        check_launch_for([*BASE, "data.global_batch_size=12"], tmp_path, nproc=5)


def train_to(env: DistEnv, run_dir: Path, overrides: list[str], steps: int) -> dict:
    """Train (or resume in `run_dir` and train) up to optimizer step `steps`, a checkpoint at each: the
    step reached, the derived batch and accumulation, rank 0's weights."""
    config = to_train_config(compose_config([*JOB, *overrides, f"trainer.max_steps={steps}"]))
    trained = build_trainer(config, env, run_dir)
    train_one_epoch(trained)
    weights = {key: tensor.clone() for key, tensor in trained.strategy.full_weights().items()}
    return {"step": trained.state.step, "split": (config.data.batch_size, config.trainer.grad_accum_steps),
            "weights": weights}  # fmt: skip


def train_losses(run_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {record["step"]: record["train_loss"] for record in records if record["kind"] == "train"}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_run_resumed_on_3_ranks_then_on_1_trains_as_the_uninterrupted_2_rank_run(tmp_path: Path, strategy) -> None:
    """A global batch of 12 on 2 ranks (6 each), stopped at step 3, resumed on 3 ranks (4 each) to step 6,
    then on 1 (4 a micro-batch, 3 accumulated: data.micro_batch_size=4) to the epoch's end (step 9, of 4
    samples): every step takes the same 12 samples as the uninterrupted 2-rank run, so the per-step train
    loss and the final weights agree. To 1e-5, not bit for bit: the sum of a step's gradient is taken in
    another order (other ranks' shares, all-reduced, or accumulated in one process)."""
    job = [f"strategy={strategy}"]
    whole = on_ranks(2, train_to, tmp_path / "whole", job, 9)[0]
    resumed = tmp_path / "resumed"
    first = on_ranks(2, train_to, resumed, job, 3)[0]
    second = on_ranks(3, train_to, resumed, job, 6)[0]
    third = on_ranks(1, train_to, resumed, [*job, "data.micro_batch_size=4"], 9)[0]
    assert [whole["split"], first["split"], second["split"], third["split"]] == [(6, 1), (6, 1), (4, 1), (4, 3)]
    assert [first["step"], second["step"], third["step"]] == [3, 6, 9] == [3, 6, whole["step"]]
    expected, got = train_losses(tmp_path / "whole"), train_losses(resumed)
    assert sorted(got) == sorted(expected) == list(range(1, 10))
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-5), f"step {step}'s train_loss"
    for key, tensor in whole["weights"].items():
        torch.testing.assert_close(third["weights"][key], tensor, rtol=1e-5, atol=1e-7, msg=f"final {key}")
    assert not torch.equal(third["weights"]["1.weight"], first["weights"]["1.weight"]), "it trained after step 3"

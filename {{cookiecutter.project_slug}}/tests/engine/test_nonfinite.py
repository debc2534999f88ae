"""engine/nonfinite.py: a non-finite loss or gradient stops the run at the log line naming its first step,
ranks, samples and parameter (<run dir>/nonfinite.jsonl), and trainer.skip_samples leaves those samples out
of every epoch, the same global batches at any world size; the sampler's part of it (engine/data/sampler.py)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from {{cookiecutter.package_name}}.common.errors import ConfigError, JobError
from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.engine.data.sampler import ResumableDistributedSampler
from {{cookiecutter.package_name}}.engine.nonfinite import (
    NONFINITE_FILE,
    NonFiniteWatch,
    findings,
    first_nonfinite,
    skip_list,
)
from {{cookiecutter.package_name}}.engine.trainer import Trainer

from ..helpers import TINY, assert_same, compose_config, cpu_env, on_ranks, train_one_epoch, trainer

GLOBAL_BATCH = 24  # 96 samples: 4 steps an epoch, on 2 ranks of 12 and on 3 of 8
POISONED_STEP = 3  # a log line every 4 steps: the run stops after step 4, naming step 3 (its 24 samples)


class Poisoned(Dataset):
    """The training set with one sample's input all NaN."""

    def __init__(self, base: Dataset, index: int) -> None:
        self.base, self.index = base, index

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, label = self.base[index]
        return (torch.full_like(image, math.nan) if index == self.index else image), label


def poisoned_trainer(env: DistEnv, run_dir: Path, step: int, *overrides: str) -> tuple[Trainer, int]:
    """A trainer whose epoch 0 meets a NaN input in step `step`; that sample's index."""
    config = to_train_config(compose_config([*TINY, f"data.batch_size={GLOBAL_BATCH // env.world_size}",
                                             "checkpoint.every_n_steps=2", *overrides]))  # fmt: skip
    trained = build_trainer(config, env, run_dir)
    sampler = ResumableDistributedSampler(96, env, GLOBAL_BATCH // env.world_size, config.seed)
    index = int(sampler.epoch_order()[(step - 1) * GLOBAL_BATCH + 17])  # rank 1's on 2 ranks
    keyed = trained.data.train_loader.dataset  # type: ignore[union-attr]
    keyed.base = Poisoned(keyed.base, index)
    return trained, index


def diverging(env: DistEnv, run_dir: Path) -> dict:
    trained, index = poisoned_trainer(env, run_dir, POISONED_STEP)
    with pytest.raises(JobError) as stopped:
        train_one_epoch(trained)
    first = next(name for name, param in trained.model.named_parameters() if param.requires_grad)
    return {"error": str(stopped.value), "index": index, "step": trained.state.step, "first_parameter": first}


def relaunched(env: DistEnv, run_dirs: list[Path]) -> list[dict]:
    """The rest of epoch 0 in each run dir, skipping nonfinite.jsonl's samples: its end and its samples."""
    ends = []
    for run_dir in run_dirs:
        skip = f"trainer.skip_samples={run_dir / NONFINITE_FILE}"
        trained, index = poisoned_trainer(env, run_dir, POISONED_STEP, skip, "trainer.record_samples=true")
        resumed_at = trained.state.step
        train_one_epoch(trained)
        audit = (run_dir / "logs" / f"samples_rank_{env.rank}.jsonl").read_text().splitlines()
        samples = {
            record["step"]: record["indices"] for record in map(json.loads, audit) if record["step"] > resumed_at
        }
        weights = {key: value.clone() for key, value in trained.strategy.full_weights().items()}
        ends.append({"resumed_at": resumed_at, "step": trained.state.step, "index": index, "samples": samples,
                     "weights": weights})  # fmt: skip
    return ends


@pytest.mark.slow
def test_a_poisoned_sample_is_named_and_relaunches_that_skip_it_train_past_it_alike_on_2_and_3_ranks(tmp_path) -> None:
    failed = tmp_path / "failed"
    ranks = on_ranks(2, diverging, failed)
    index, error = ranks[0]["index"], ranks[0]["error"]
    assert all(rank["step"] == 4 and rank["error"] == error for rank in ranks), "every rank stops at the log line"
    [record] = [json.loads(line) for line in (failed / NONFINITE_FILE).read_text().splitlines()]
    assert record["step"] == POISONED_STEP and record["cause"] == "loss" and record["world_size"] == 2, record
    assert index in record["indices"] and len(record["indices"]) == GLOBAL_BATCH, "the step's global batch"
    assert record["ranks"] == [1], "the rank whose loss met the NaN (rank 0's loss was finite at that step)"
    assert record["parameter"] == ranks[0]["first_parameter"], "a NaN input: every gradient is NaN, the first named"
    assert error.startswith(f"training diverged by step {POISONED_STEP}: the loss is not finite on rank"), error
    assert f" {index}" in error and f"trainer.skip_samples={failed / NONFINITE_FILE}" in error, error
    runs = {}
    for world_size in (2, 3):
        dirs = [tmp_path / f"{world_size}_{n}" for n in range(2)]
        for run_dir in dirs:
            shutil.copytree(failed, run_dir)
            (run_dir / "logs").mkdir(exist_ok=True)  # the sample audit's (the launcher makes it)
        runs[world_size] = on_ranks(world_size, relaunched, dirs)
    for world_size, ends in runs.items():
        first, again = ends[0]
        assert first["resumed_at"] == 2 and first["step"] == 3, "resumed from step 2; the epoch: 96 - 24 samples"
        assert_same(again["weights"], first["weights"], f"two relaunches on {world_size} ranks")
        assert all(torch.isfinite(value).all() for value in first["weights"].values() if value.is_floating_point())
    batches = {
        world_size: sorted(i for rank in ends for i in rank[0]["samples"][3]) for world_size, ends in runs.items()
    }
    assert batches[2] == batches[3], "the same global batches, less the skipped samples, at any world size"
    assert len(batches[2]) == GLOBAL_BATCH and not set(batches[2]) & set(record["indices"]), "step 4's of the first run"


def test_a_non_finite_step_before_a_checkpoint_is_named_not_refused_as_non_finite_weights(tmp_path: Path) -> None:
    """Step 2 is not a log line's but a checkpoint's: the check runs before the weights are saved."""
    trained, index = poisoned_trainer(cpu_env(0, 1), tmp_path, 2, "data.train_size=96")
    with pytest.raises(JobError, match=rf"training diverged by step 2: the loss is not finite on rank 0; first "
                                       rf"non-finite gradient: \S+; the step's samples .*\b{index}\b"):  # fmt: skip
        train_one_epoch(trained)
    assert trained.state.step == 2 and not (tmp_path / "checkpoints" / "step_00000002.pt").exists()
    assert json.loads((tmp_path / NONFINITE_FILE).read_text())["step"] == 2


def test_first_nonfinite_names_the_first_gradient_holding_a_nan_or_an_inf() -> None:
    grads = [torch.ones(3), torch.tensor([1.0, math.inf]), torch.tensor([math.nan])]
    assert int(first_nonfinite(grads, torch.device("cpu"))) == 1
    assert int(first_nonfinite(grads[:1], torch.device("cpu"))) == -1


def test_a_gradient_alone_non_finite_is_said_as_the_gradient_on_every_rank() -> None:
    ranks = [{"rank": r, "finite_steps": [4, 1], "parameter": 2, "indices": {"7": [r], "8": [9]}} for r in (0, 1)]
    record = findings(ranks, ["a", "b", "c"], 7, 0)
    assert record == {"step": 8, "epoch": 0, "cause": "gradient", "ranks": [0, 1], "parameter": "c",
                      "indices": [9, 9], "world_size": 2}  # fmt: skip


def test_the_trainer_finds_the_watch_and_fp16_leaves_its_skipped_non_finite_gradients_alone(tmp_path: Path) -> None:
    fp16, fp32 = trainer(tmp_path / "a", "trainer.precision=fp16"), trainer(tmp_path / "b")
    assert isinstance(fp32.divergence, NonFiniteWatch) and fp32.runner.before_clipping == fp32.divergence.note_gradients
    assert isinstance(fp16.divergence, NonFiniteWatch) and fp16.runner.before_clipping is None


def test_skipped_samples_leave_the_order_before_it_is_split_and_a_resume_counts_in_it() -> None:
    orders = {}
    for world_size in (1, 2, 3):
        samplers = [ResumableDistributedSampler(50, cpu_env(rank, world_size), 12 // world_size, 7)
                    for rank in range(world_size)]  # fmt: skip
        plain = samplers[0].epoch_order().tolist()
        for sampler in samplers:
            sampler.skip([plain[3], plain[30]])
            sampler.set_epoch(1)
        assert samplers[0].dataset_size == 48 and samplers[0].epoch_order().tolist() != plain
        samplers[0].set_epoch(0)
        assert samplers[0].epoch_order().tolist() == [i for i in plain if i not in (plain[3], plain[30])]
        samplers[0].set_epoch(1)
        for sampler in samplers:
            sampler.set_start(24)  # two global batches done
        keys = [list(sampler) for sampler in samplers]
        orders[world_size] = sorted(index for rank in keys for index, _, weight in rank if weight)
        assert sum(len(rank) for rank in keys) == 24 and samplers[0].steps_left() == 2
    assert orders[1] == orders[2] == orders[3]
    sampler = ResumableDistributedSampler(50, cpu_env(0, 1), 12, 7)
    before = sampler.epoch_order()
    sampler.skip([])
    assert torch.equal(sampler.epoch_order(), before) and sampler.dataset_size == 50, "nothing skipped: as before"


def test_skip_samples_takes_a_list_or_a_nonfinite_file_and_refuses_anything_else_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / NONFINITE_FILE
    path.write_text('{"step": 3, "indices": [5, 2]}\n{"step": 9, "indices": [2, 40]}\n')
    assert skip_list(str(path)) == [2, 5, 40] and skip_list([3, 1]) == [1, 3] and skip_list(None) == []
    with pytest.raises(ConfigError, match="no such file"):
        skip_list(str(tmp_path / "missing.jsonl"))
    with pytest.raises(
        ConfigError, match=r"trainer.skip_samples names sample 96; the training set's indices are 0 to 95"
    ):
        trainer(tmp_path / "run", "trainer.skip_samples=[3,96]")

"""build.py: a config wired into a Trainer (strategy, model, data, task, optimizer, sinks), and a
build on a run dir with a checkpoint continuing where it stopped."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer, use_deterministic_kernels
from {{cookiecutter.package_name}}.engine.checkpoint.files import load_checkpoint
from {{cookiecutter.package_name}}.engine.distributed.generators import seed_rank
from {{cookiecutter.package_name}}.engine.strategies.ddp import DDP
from {{cookiecutter.package_name}}.engine.trainer import Trainer
from {{cookiecutter.package_name}}.models import SmallCNN
from {{cookiecutter.package_name}}.observe.sinks import build_sinks
from {{cookiecutter.package_name}}.tasks import Classification

from ...helpers import check_launch_for, compose_config, cpu_env

TINY = ["model=small_cnn", "model.width=4", "data=synthetic", "data.train_size=48", "data.val_size=16",
        "data.batch_size=16", "data.image_size=8", "trainer.epochs=1"]  # fmt: skip


@pytest.fixture
def built() -> Iterator[list[Trainer]]:
    """The trainers a test built, their sinks closed after it (a sink's writer may hold a thread)."""
    trainers: list[Trainer] = []
    yield trainers
    for trainer in trainers:
        trainer.metrics.close()


def build(trainers: list[Trainer], run_dir: Path, *overrides: str, env: DistEnv | None = None) -> Trainer:
    trainer = build_trainer(to_train_config(compose_config([*TINY, *overrides])), env or cpu_env(0, 1), run_dir)
    trainers.append(trainer)
    return trainer


def test_the_config_chooses_the_strategy_model_data_task_and_optimizer(tmp_path: Path, built) -> None:
    trainer = build(built, tmp_path, "optim=sgd", "optim.lr=0.25", "data.batch_size=12")
    assert isinstance(trainer.strategy, DDP) and trainer.strategy.name == "ddp"
    assert isinstance(trainer.model, SmallCNN) and trainer.model[0][0].out_channels == 4
    assert trainer.runner.trained is trainer.model, "a world of one: no DDP wrapper"
    assert isinstance(trainer.task, Classification)
    assert type(trainer.optimizer) is torch.optim.SGD
    assert {group["lr"] for group in trainer.optimizer.param_groups} == {0.25}
    stepped = [id(p) for group in trainer.optimizer.param_groups for p in group["params"]]
    assert sorted(stepped) == sorted(id(p) for p in trainer.model.parameters()), "every weight, once"
    assert len(trainer.data.train_loader.dataset) == 48 and trainer.data.train_loader.batch_size == 12
    images, labels, *_ = next(iter(trainer.data.train_loader))
    assert images.shape == (12, 3, 8, 8) and labels.shape == (12,)
    assert trainer.state.step == 0 and trainer.metrics.path == tmp_path / "metrics.jsonl"


def test_each_process_gets_its_shard_of_the_data(tmp_path: Path, built) -> None:
    samplers = [build(built, tmp_path / str(rank), env=cpu_env(rank, 2)).data.sampler for rank in (0, 1)]
    shards = [{index for index, _, _ in sampler} for sampler in samplers]
    assert not shards[0] & shards[1] and shards[0] | shards[1] == set(range(48))


def test_the_seed_decides_the_initial_weights(tmp_path: Path, built) -> None:
    first, again, other = (build(built, tmp_path / name, f"seed={seed}").model for name, seed in
                           (("a", 1), ("b", 1), ("c", 2)))  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), again.parameters(), strict=True))
    assert not torch.equal(first[0][0].weight, other[0][0].weight)


def test_rank_zero_alone_feeds_the_sinks_the_config_switches_on(tmp_path: Path, built) -> None:
    main = build(built, tmp_path / "main")
    log = to_train_config(compose_config(TINY)).log
    expected = [type(sink) for sink in build_sinks(log, tmp_path / "probe", cpu_env(0, 1))]  # as configured
    assert [type(sink) for sink in main.metrics.sinks] == expected and main.metrics.enabled
    other = build(built, tmp_path / "other", env=cpu_env(1, 2))
    assert other.metrics.sinks == [] and not other.metrics.enabled


def test_a_fresh_build_leaves_each_ranks_generators_seeded_from_the_seed_and_its_rank(tmp_path: Path, built) -> None:
    build(built, tmp_path / "a", "seed=5", env=cpu_env(1, 2))
    after_build = (torch.rand(4), random.random())
    seed_rank(5, 0, 1)
    assert torch.equal(torch.rand(4), after_build[0]) and random.random() == after_build[1]


def test_a_build_on_a_run_dir_with_a_checkpoint_continues_at_its_step(tmp_path: Path, built) -> None:
    first = build(built, tmp_path)
    torch.rand(3), random.random()  # what dropout would have drawn: other states than a fresh start's
    first.fit()  # 3 steps, a checkpoint at the epoch's end
    (checkpoint,) = (tmp_path / "checkpoints").glob("step_*.pt")
    saved = load_checkpoint(checkpoint)
    assert saved["step"] == 3
    with open(tmp_path / "metrics.jsonl", "a") as file:  # what a killed run logged past its checkpoint
        file.write(json.dumps({"kind": "train", "step": 5, "train_loss": 1.0}) + "\n")

    resumed = build(built, tmp_path, "trainer.epochs=2")
    generators_after_build = torch.get_rng_state()
    assert (resumed.state.step, resumed.state.epoch) == (3, 1)
    for name, tensor in resumed.model.state_dict().items():
        assert torch.equal(tensor, saved["model"][name]), name
    assert resumed.optimizer.state_dict()["state"].keys() == saved["optimizer"]["state"].keys()
    assert torch.equal(generators_after_build, saved["rank_states"][0]["torch"]), "the saved generators, untouched"
    seed_rank(0, 0, 0)
    assert not torch.equal(torch.get_rng_state(), generators_after_build), "not a fresh start's"
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps and max(steps) == 3, "the records past the checkpoint are dropped: the resumed run logs them again"


def test_a_resume_from_the_checks_payload_continues_at_its_step_and_does_not_write_that_step_again(
    tmp_path: Path, built
) -> None:
    """The start's checks read the checkpoint (Built.resume); the trainer resumes from that payload, and a save at
    the resumed step (a stop signal before the first step) writes nothing: the step is on the disk already."""
    build(built, tmp_path).fit()  # 3 steps, a checkpoint at the epoch's end
    checked = check_launch_for([*TINY, "trainer.epochs=2"], tmp_path)
    assert checked.resume is not None and checked.resume[1]["step"] == 3
    config = to_train_config(compose_config([*TINY, "trainer.epochs=2"]))
    resumed = build_trainer(config, cpu_env(0, 1), tmp_path, checked)
    built.append(resumed)
    assert (resumed.state.step, resumed.state.epoch) == (3, 1)
    assert resumed.save() is None, "the resumed step is not written again"


def test_deterministic_switch_sets_every_gpu_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    use_deterministic_kernels(False)
    assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    torch.backends.cudnn.benchmark = True
    try:
        use_deterministic_kernels(True)
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.backends.cudnn.benchmark is False
    finally:
        torch.use_deterministic_algorithms(False)

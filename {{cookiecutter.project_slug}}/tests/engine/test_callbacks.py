"""engine/callbacks.py: the config's callbacks composed from the command line, their events in order, their
per-rank state across a resume on two ranks (under each strategy), and the one line of a callback that raises.
The examples of <package>/callbacks.py: tests/test_callbacks.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError, JobError
from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.trainer import Trainer

from ..helpers import STRATEGIES, TINY, assert_same, compose_config, on_ranks, train_stop_resume, trainer

HERE = __name__  # tests.engine.test_callbacks: the callbacks below, named by _target_


class Recorder:
    """Every event with the step it saw, and whether that step's checkpoint was on disk yet."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def on_train_start(self, run) -> None:
        self.seen.append(("train_start", run.step))

    def on_step_start(self, run) -> None:
        self.seen.append(("step_start", run.step))

    def on_step_end(self, run) -> None:
        self.seen.append(("step_end", run.step))

    def on_validation_end(self, run, metrics) -> None:
        assert "val_loss" in metrics
        self.seen.append(("validation_end", run.step))

    def on_train_end(self, run) -> None:
        self.seen.append(("train_end", run.step))


class NoisyMean:
    """A callback with state of its own: a running mean of draws from a generator of its rank."""

    def __init__(self, seed: int) -> None:
        self.seed, self.count, self.mean, self.generator = seed, 0, torch.zeros(()), None

    def on_step_end(self, run) -> None:
        if self.generator is None:
            self.generator = torch.Generator().manual_seed(self.seed + run.rank)
        self.count += 1
        self.mean += (torch.rand((), generator=self.generator) - self.mean) / self.count

    def state_dict(self) -> dict:
        generator = self.generator.get_state() if self.generator is not None else None
        return {"count": self.count, "mean": self.mean.clone(), "generator": generator}

    def load_state_dict(self, state: dict) -> None:
        self.count, self.mean = state["count"], state["mean"].clone()
        if state["generator"] is not None:
            self.generator = torch.Generator()
            self.generator.set_state(state["generator"])


class Raises:
    def on_step_end(self, run) -> None:
        if run.step == 2:
            raise ValueError("no step 2 here")


class OddState:
    """A state_dict that is not a checkpoint's: by `kind`, it raises, returns a list, or holds an object."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def state_dict(self) -> dict:
        if self.kind == "raises":
            raise KeyError("count")
        return [1, 2] if self.kind == "list" else {"when": Path("/a/date")}  # type: ignore[return-value]


class Counts:
    """A figure and a state of its own, the same name in every instance: the count of its steps."""

    def __init__(self, every: int) -> None:
        self.every, self.count = every, 0

    def on_step_end(self, run) -> None:
        if run.step % self.every == 0:
            self.count += 1
            run.log("count", self.count)

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"]


def test_a_callback_composes_from_the_command_line_and_a_missing_target_is_one_line(tmp_path: Path) -> None:
    config = to_train_config(compose_config([*TINY, f"+callbacks.mean._target_={HERE}.NoisyMean",
                                             "+callbacks.mean.seed=3"]))  # fmt: skip
    assert config.callbacks == {"mean": {"_target_": f"{HERE}.NoisyMean", "seed": 3}}
    assert to_train_config(compose_config(TINY)).callbacks == {}
    with pytest.raises(ConfigError, match=r"^callbacks.mean needs a _target_"):
        to_train_config(compose_config([*TINY, "+callbacks.mean.seed=3"]))
    with pytest.raises(ConfigError, match=r"^callbacks.mean._target_=nowhere.Mean does not import"):
        trainer(tmp_path, "+callbacks.mean._target_=nowhere.Mean")


def test_the_events_come_in_order_around_steps_validations_and_checkpoints(tmp_path: Path) -> None:
    run = trainer(tmp_path, f"+callbacks.rec._target_={HERE}.Recorder", "trainer.max_steps=3",
                  "trainer.val_every_n_steps=2")  # fmt: skip
    run.fit()
    seen = run.callbacks.named["rec"].seen
    assert seen == [
        ("train_start", 0),
        ("step_start", 0), ("step_end", 1),
        ("step_start", 1), ("step_end", 2), ("validation_end", 2),
        ("step_start", 2), ("step_end", 3), ("validation_end", 3),  # the end's validation
        ("train_end", 3),
    ]  # fmt: skip


def test_a_callback_that_raises_stops_the_run_with_one_line_naming_it(tmp_path: Path) -> None:
    run = trainer(tmp_path, f"+callbacks.bad._target_={HERE}.Raises", "trainer.max_steps=4")
    with pytest.raises(JobError) as raised:
        run.fit()
    message = str(raised.value)
    assert message == "callbacks.bad.on_step_end raised ValueError: no step 2 here: fix it or remove it"
    assert run.state.step == 2


def mean_state(trained: Trainer) -> dict:
    return trained.callbacks.named["mean"].state_dict()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_callbacks_own_state_resumes_bit_exactly_on_each_of_two_ranks(tmp_path: Path, strategy: str) -> None:
    callback = [f"strategy={strategy}", f"+callbacks.mean._target_={HERE}.NoisyMean", "+callbacks.mean.seed=7"]
    ranks = on_ranks(2, train_stop_resume, tmp_path, callback, mean_state)
    for rank, ends in enumerate(ranks):
        assert ends["uninterrupted_step"] == ends["resumed_step"] == 6
        assert ends["resumed_extra"]["count"] == 6
        assert_same(ends["resumed_extra"], ends["uninterrupted_extra"], f"rank {rank}'s callback state")
    assert not torch.equal(ranks[0]["resumed_extra"]["mean"], ranks[1]["resumed_extra"]["mean"]), "each rank its own"


def test_a_callbacks_figures_reach_metrics_jsonl(tmp_path: Path) -> None:
    run = trainer(tmp_path, f"+callbacks.rec._target_={HERE}.Recorder", "trainer.max_steps=2")
    run.callbacks.run.log("extra/figure", torch.tensor(0.5))
    run.callbacks.run.log("plain", 2)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records == [{"kind": "callback", "step": 0, "epoch": 0, "extra/figure": 0.5},
                       {"kind": "callback", "step": 0, "epoch": 0, "callbacks/plain": 2.0}]  # fmt: skip


def test_on_another_world_size_every_rank_takes_rank_zeros_state_and_a_new_callback_starts_afresh() -> None:
    from {{cookiecutter.package_name}}.engine.callbacks import Callbacks, CallbackStates

    saved = [{"mean": {"count": 4, "mean": torch.tensor(0.25), "generator": None}},
             {"mean": {"count": 4, "mean": torch.tensor(0.75), "generator": None}}]  # fmt: skip
    for rank, world_size, expected in ((1, 2, 0.75), (2, 3, 0.25)):
        callbacks = Callbacks({"mean": NoisyMean(0), "new": NoisyMean(0)})
        env = DistEnv(rank, rank, world_size, world_size, "gloo", torch.device("cpu"))
        CallbackStates(callbacks, env).load_state_dict({"callbacks": saved})
        assert callbacks.named["mean"].mean.item() == expected and callbacks.named["new"].count == 0


def test_a_callback_whose_state_is_not_a_checkpoints_stops_the_run_with_one_line_naming_it(tmp_path: Path) -> None:
    plain = "it must return a dict of tensors and plain values (numbers, strings, lists, dicts): fix it or remove it"
    lines = {"raises": "callbacks.odd.state_dict raised KeyError: 'count': fix it or remove it",
             "list": f"callbacks.odd.state_dict returned a list of 2: {plain}",
             "object": f"callbacks.odd.state_dict returned a value that is not a tensor or a plain value (PosixPath): "
                       f"{plain}"}  # fmt: skip
    for kind, line in lines.items():
        run = trainer(tmp_path / kind, f"+callbacks.odd._target_={HERE}.OddState", f"+callbacks.odd.kind={kind}",
                      "trainer.max_steps=1")  # fmt: skip
        with pytest.raises(JobError) as stopped:
            run.fit()
        assert (str(stopped.value), stopped.value.exit_code) == (line, 2), kind


def test_two_callbacks_of_one_class_keep_their_own_figures_and_states(tmp_path: Path) -> None:
    """Their figures by the same name are told apart by their keys (the first in the config keeps the name);
    their states are theirs by key, as a run of one callback per class has them."""
    twice = [f"+callbacks.every._target_={HERE}.Counts", "+callbacks.every.every=1",
             f"+callbacks.second._target_={HERE}.Counts", "+callbacks.second.every=2"]  # fmt: skip
    run = trainer(tmp_path, *twice, "trainer.max_steps=2", "checkpoint.every_n_steps=2")
    run.fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    figures = [(r["step"], name, value) for r in records if r["kind"] == "callback" for name, value in r.items()
               if name.startswith("callbacks/")]  # fmt: skip
    assert figures == [(1, "callbacks/count", 1.0), (2, "callbacks/count", 2.0), (2, "callbacks/count/second", 1.0)]
    saved = torch.load(tmp_path / "checkpoints" / "step_00000002.pt", weights_only=True)["callbacks"]
    assert saved == [{"every": {"count": 2}, "second": {"count": 1}}]
    resumed = trainer(tmp_path, *twice, "trainer.max_steps=4")
    assert {name: cb.count for name, cb in resumed.callbacks.named.items()} == {"every": 2, "second": 1}

"""callbacks.py, the docs' examples: freezing a backbone until step N trains under each strategy on two
ranks; a figure every K steps and a second validation set reach metrics.jsonl (and eval.py reads a
checkpoint whose config names them)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.datasets import synthetic_images
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.engine.preemption import StopOnSigterm

from .helpers import STRATEGIES, TINY, compose_config, on_ranks, trainer

PACKAGE = "{{cookiecutter.package_name}}"
FROZEN = "0."  # small_cnn's first convolution block


class Snapshots:
    """Each parameter's local values (a shard under a sharding strategy) after every step."""

    def __init__(self) -> None:
        self.after: list[dict[str, torch.Tensor]] = []

    def on_train_start(self, run) -> None:
        self.on_step_end(run)

    def on_step_end(self, run) -> None:
        self.after.append({name: local_values(p) for name, p in run.model.named_parameters()})


def local_values(parameter: torch.Tensor) -> torch.Tensor:
    """This rank's values of a parameter: its shard where the model is sharded."""
    return (parameter.to_local() if hasattr(parameter, "to_local") else parameter).detach().clone()


def freeze_two_steps(env: DistEnv, run_dir: Path, strategy: str) -> list[dict[str, bool]]:
    """4 steps with small_cnn's first block frozen for 2: after each step, which parameters moved."""
    config = to_train_config(compose_config([
        *TINY, "data.train_size=256", "data.batch_size=8", "trainer.max_steps=4", f"strategy={strategy}",
        f"+callbacks.freeze._target_={PACKAGE}.callbacks.FreezeUntil", "+callbacks.freeze.step=2",
        f"+callbacks.freeze.prefixes=['{FROZEN}']", f"+callbacks.snap._target_={__name__}.Snapshots",
    ]))  # fmt: skip
    run = build_trainer(config, env, run_dir)
    stop = StopOnSigterm()
    try:
        run.callbacks.fire("on_train_start")
        run.train_epoch(stop)
    finally:
        stop.close()
    after = run.callbacks.named["snap"].after
    return [{name: not torch.equal(after[i][name], after[i - 1][name]) for name in after[0]} for i in (1, 2, 3, 4)]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_frozen_backbone_stays_put_until_its_step_then_trains(tmp_path: Path, strategy: str) -> None:
    moved = on_ranks(2, freeze_two_steps, tmp_path, strategy)[0]
    for step, changed in enumerate(moved, 1):
        frozen = {name: value for name, value in changed.items() if name.startswith(FROZEN)}
        others = {name: value for name, value in changed.items() if not name.startswith(FROZEN)}
        assert all(others.values()), f"step {step}: the rest trains"
        assert (not any(frozen.values())) if step <= 2 else all(frozen.values()), f"step {step}: {frozen}"


def test_a_figure_every_k_steps_and_a_second_validation_set_reach_metrics_jsonl(tmp_path: Path) -> None:
    """val2 is the validation set itself: its figures equal the validation's at that step. `other` is
    another set (seed 1): its figures are its own, as run.evaluate gives them for the weights of step 2."""
    dataset, other = "+callbacks.val2.dataset", "+callbacks.other.dataset"
    run = trainer(tmp_path, "trainer.max_steps=2", "trainer.val_every_n_steps=1", "data.train_size=256",
                  f"+callbacks.norm._target_={PACKAGE}.callbacks.LogWeightNorm", "+callbacks.norm.every=2",
                  f"+callbacks.val2._target_={PACKAGE}.callbacks.SecondValidation", "+callbacks.val2.every=1",
                  f"{dataset}._target_={PACKAGE}.datasets.synthetic_images", f"{dataset}.num_classes=10",
                  f"{dataset}.image_size=32", f"{dataset}.train_size=8", f"{dataset}.val_size=16",
                  f"{dataset}.seed=0",
                  f"+callbacks.other._target_={PACKAGE}.callbacks.SecondValidation", "+callbacks.other.every=2",
                  "+callbacks.other.name=other", f"{other}._target_={PACKAGE}.datasets.synthetic_images",
                  f"{other}.num_classes=10", f"{other}.image_size=32", f"{other}.train_size=8",
                  f"{other}.val_size=8", f"{other}.seed=1")  # fmt: skip
    run.fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    norms = [(r["step"], r["weights/norm"]) for r in records if "weights/norm" in r]
    assert [step for step, _ in norms] == [2] and norms[0][1] > 0
    val = {r["step"]: r for r in records if r["kind"] == "val"}
    val2 = {(r["step"], name): value for r in records for name, value in r.items() if name.startswith("val2/")}
    for step in (1, 2):
        assert val2[(step, "val2/loss")] == val[step]["val_loss"]
        assert val2[(step, "val2/acc")] == val[step]["val_acc"]
    figures = run.callbacks.run.evaluate(synthetic_images(num_classes=10, image_size=32, train_size=8, val_size=8,
                                                          seed=1)[1])  # fmt: skip
    logged = {(r["step"], name): value for r in records for name, value in r.items() if name.startswith("other/")}
    assert logged == {(2, f"other/{name}"): figures[name] for name in ("loss", "acc", "macro_f1")}
    assert figures["loss"] != val[2]["val_loss"], "the other set's figures, not the validation set's"


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler:UserWarning")
def test_eval_evaluates_a_checkpoint_whose_config_names_the_example_callbacks_and_runs_none(
    in_process, tmp_path: Path, monkeypatch, capsys
) -> None:
    from {{cookiecutter.package_name}} import eval as eval_entry

    run = trainer(tmp_path, "trainer.max_steps=2", f"+callbacks.norm._target_={PACKAGE}.callbacks.LogWeightNorm",
                  "+callbacks.norm.every=1")  # fmt: skip
    figures = run.fit().line()
    lines = (tmp_path / "metrics.jsonl").read_text().count("weights/norm")
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["eval.py", f"ckpt_path={tmp_path / 'checkpoints' / 'step_00000002.pt'}"])
    eval_entry.main()
    assert capsys.readouterr().out == figures + "\n" and in_process == [0]
    assert (tmp_path / "metrics.jsonl").read_text().count("weights/norm") == lines == 2, "eval runs no callback"

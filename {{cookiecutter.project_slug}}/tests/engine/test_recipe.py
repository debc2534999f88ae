"""The training recipe in the trainer (trainer.max_steps, val_every_n_steps, checkpoint.keep_best, early
stopping, trainer.ema, a torch scheduler), in this process and on two gloo ranks: a run that crashes
between two validations and resumes ends as the uninterrupted one does, with the same validation records
and the same best checkpoint; early stopping ends every rank at one step, and a relaunch has finished."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.common.run_dir import FINISHED_MARKER
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer

from ..helpers import CPU, STRATEGIES, TINY, assert_same, compose_config, on_ranks

RECIPE = [
    "data.train_size=48", "data.batch_size=4", "trainer.max_steps=10", "trainer.val_every_n_steps=3",
    "checkpoint.every_n_steps=4", "checkpoint.keep_last=1", "checkpoint.keep_best=1", "trainer.ema.decay=0.8",
    "trainer.ema.start_step=2", "scheduler._target_=torch.optim.lr_scheduler.StepLR", "+scheduler.step_size=2",
    "+scheduler.gamma=0.7", "scheduler.warmup_steps=2", "trainer.log_every_n_steps=1",
]  # fmt: skip


class Crash(RuntimeError):
    """A worker dying mid-run: what a restart (torchrun's, or the user's) recovers from."""


def recipe_run(env: DistEnv, run_dir: Path, overrides: list[str], crash_after: int | None) -> dict:
    """The recipe run to its end; with `crash_after`, it dies after that step first and a new trainer
    (a restarted worker) resumes it. Its ends: weights, EMA, validation records, best checkpoint."""
    config = to_train_config(compose_config([*TINY, *RECIPE, *overrides]))
    if crash_after is not None:
        first = build_trainer(config, env, run_dir)
        step = first.train_step

        def step_then_crash(*args) -> None:
            step(*args)
            if first.state.step == crash_after:
                raise Crash(f"after step {crash_after}")

        first.train_step = step_then_crash
        with pytest.raises(Crash):
            first.fit()
    trained = build_trainer(config, env, run_dir)
    result = trained.fit()
    ema = {name: average.full_tensor() if hasattr(average, "full_tensor") else average.clone()
           for name, average in trained.ema.state_dict()["ema"].items()}  # fmt: skip
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()] if env.is_main else []
    best = json.loads((run_dir / "checkpoints" / "best.json").read_text()) if env.is_main else {}
    return {"weights": {k: v.clone() for k, v in trained.strategy.full_weights().items()}, "ema": ema,
            "val": [r for r in records if r["kind"] == "val"], "lr": [r["lr"] for r in records if r["kind"] == "train"],
            "best": best, "step": trained.state.step, "result": result.metrics}  # fmt: skip


def test_a_step_counted_run_that_crashes_between_validations_resumes_to_the_same_end(tmp_path: Path) -> None:
    whole = recipe_run_alone(tmp_path / "whole", [], None)
    resumed = recipe_run_alone(tmp_path / "resumed", [], 5)  # its last checkpoint: step 4, validated at 3
    assert whole["step"] == resumed["step"] == 10, "trainer.max_steps, across an epoch's end (12 steps each)"
    assert [r["step"] for r in whole["val"]] == [3, 6, 9, 10], "every 3 steps, and at the end"
    assert_same(resumed, whole, "the resumed run")
    assert whole["lr"][:4] == pytest.approx([0.05, 0.1, 0.1, 0.07]), "warm-up, then StepLR from optim.lr"
    assert whole["best"]["best"] == [f"step_{min(whole['val'], key=lambda r: r['val_loss'])['step']:08d}.pt"]


def recipe_run_alone(run_dir: Path, overrides: list[str], crash_after: int | None) -> dict:
    from ..helpers import CPU

    return recipe_run(CPU, run_dir, overrides, crash_after)


def recipe_on_two_ranks(env: DistEnv, tmp_path: Path, strategy: str) -> dict:
    ends = {}
    for name, crash_after in (("whole", None), ("resumed", 7)):
        ends[name] = recipe_run(env, tmp_path / f"{strategy}_{name}", [f"strategy={strategy}"], crash_after)
    return ends


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_ema_and_the_recipe_resume_exactly_on_two_ranks(tmp_path: Path, strategy: str) -> None:
    ranks = on_ranks(2, recipe_on_two_ranks, tmp_path, strategy)
    assert_same(ranks[0]["resumed"], ranks[0]["whole"], f"{strategy}: the resumed run on rank 0")
    assert_same(ranks[1]["resumed"]["ema"], ranks[0]["whole"]["ema"], "rank 1's EMA is rank 0's")
    assert ranks[0]["whole"]["result"] == ranks[1]["whole"]["result"], "the same validation on every rank"
    assert not torch.equal(*(next(iter(ranks[0]["whole"][key].values())) for key in ("ema", "weights")))


def stop_early(env: DistEnv, run_dir: Path) -> list[tuple[int, str, bool, dict]]:
    """Two runs in one process group: one that nothing improves by 100 stops at its third validation (10 steps
    an epoch on two ranks: step 6 falls mid-epoch, where the loop itself must end); one whose stop the
    validation figures decide (val_acc, patience 1, any improvement counts)."""
    recipes = {"by_rule": ["trainer.early_stop_patience=2", "trainer.early_stop_min_delta=100"],
               "by_figures": ["trainer.early_stop_patience=1", "checkpoint.monitor=val_acc", "checkpoint.mode=max",
                              "data.val_size=40"]}  # fmt: skip
    ended = []
    for name, recipe in recipes.items():
        overrides = [*TINY, "data.batch_size=8", "data.train_size=160", "trainer.epochs=5",
                     "trainer.val_every_n_steps=2", *recipe]  # fmt: skip
        config = to_train_config(compose_config(overrides))
        trained = build_trainer(config, env, run_dir / name)
        trained.fit()
        again = build_trainer(config, env, run_dir / name)  # a relaunch
        ended.append((trained.state.step, trained.monitor.stopped, again.finished(), trained.monitor.state_dict()))
    return ended


def first_stop(figures: list[tuple[int, float]], patience: int) -> int | None:
    """The step at which a run validated with these (step, figure) pairs, larger better, stops."""
    best, bad = None, 0
    for step, figure in figures:
        if best is None or figure > best:
            best, bad = figure, 0
        else:
            bad += 1
            if bad >= patience:
                return step
    return None


@pytest.mark.slow
def test_early_stopping_ends_every_rank_at_the_step_the_global_figures_decide(tmp_path: Path) -> None:
    ranks = on_ranks(2, stop_early, tmp_path)
    (by_rule, by_figures), other = ranks[0], ranks[1]
    assert [run[:3] for run in ranks[0]] == [run[:3] for run in other], "every rank at one step, for one reason"
    assert by_rule[:3] == (6, by_rule[1], True)
    assert by_rule[1].startswith("val_loss has not improved for 2 validations (patience 2; best ")
    assert (tmp_path / "by_rule" / FINISHED_MARKER).read_text() == "6\n"
    # The figures every rank decides on are the global ones rank 0 writes (each rank's half would differ).
    records = [json.loads(line) for line in (tmp_path / "by_figures" / "metrics.jsonl").read_text().splitlines()]
    figures = [(record["step"], record["val_acc"]) for record in records if record["kind"] == "val"]
    assert by_figures[3] == other[1][3], "the same ranking on every rank"
    stop = first_stop(figures, 1)
    assert stop is not None and by_figures[0] == stop and figures[-1][0] == stop, (figures, by_figures)
    assert by_figures[3]["monitor"]["reference"] == max(figure for _, figure in figures)
    assert by_figures[3]["monitor"]["best"][0] == [next(s for s, f in figures if f == max(f for _, f in figures)),
                                                   max(f for _, f in figures)]  # fmt: skip


def test_a_plateau_scheduler_steps_with_the_monitored_figure_and_resumes_to_the_same_end(tmp_path: Path) -> None:
    """ReduceLROnPlateau's step() needs a figure: it takes checkpoint.monitor's after each validation (here
    every 3 steps, after a 2-step warm-up), and its state is in the checkpoint like any scheduler's."""
    plateau = ["scheduler._target_=torch.optim.lr_scheduler.ReduceLROnPlateau", "~scheduler.step_size",
               "~scheduler.gamma", "+scheduler.patience=0", "+scheduler.factor=0.5", "+scheduler.threshold=10",
               "trainer.max_steps=7"]  # fmt: skip
    whole = recipe_run_alone(tmp_path / "whole", plateau, None)  # nothing improves by 1000%: halved each time
    resumed = recipe_run_alone(tmp_path / "resumed", plateau, 4)  # from step 3's, the best: after step 3's halving
    assert_same(resumed, whole, "the resumed run")
    assert whole["lr"] == pytest.approx([0.05, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025]), "halved after each validation"


def relaunch(run_dir: Path, *overrides: str) -> Any:
    """A run of the recipe's model and data (6 steps an epoch, a validation every 2) in `run_dir`."""
    from ..helpers import CPU

    recipe = ["data.train_size=48", "data.batch_size=8", "trainer.log_every_n_steps=1", "trainer.val_every_n_steps=2"]
    config = to_train_config(compose_config([*TINY, *recipe, *overrides]))

    return build_trainer(config, CPU, run_dir)


def test_a_resume_that_changes_the_monitor_ranks_afresh_and_best_json_names_only_the_new_best(tmp_path, caplog) -> None:
    caplog.set_level("INFO")
    first = relaunch(tmp_path, "trainer.max_steps=6", "checkpoint.keep_best=2", "trainer.early_stop_patience=9")
    first.fit()
    assert first.monitor.bad > 0 or first.monitor.best, "ranked under val_loss"
    again = relaunch(tmp_path, "trainer.max_steps=12", "checkpoint.keep_best=2", "trainer.early_stop_patience=9",
                     "checkpoint.monitor=val_acc", "checkpoint.mode=max")  # fmt: skip
    assert "checkpoint.monitor changed (val_loss, min -> val_acc, max)" in caplog.text
    assert (again.monitor.best, again.monitor.bad) == ([], 0)
    again.fit()
    best = json.loads((tmp_path / "checkpoints" / "best.json").read_text())
    assert best["steps"] and min(best["steps"]) > 6, f"only what val_acc ranked: {best}"
    assert all((tmp_path / "checkpoints" / name).exists() for name in best["best"])


def test_keep_best_switched_on_at_a_resume_lists_only_checkpoints_that_exist(tmp_path: Path) -> None:
    first = relaunch(tmp_path, "trainer.max_steps=6", "trainer.early_stop_patience=9", "checkpoint.every_n_steps=3")
    first.fit()  # validations at 2, 4 and 6 ranked for early stopping; checkpoints at 3 and 6
    again = relaunch(tmp_path, "trainer.max_steps=8", "trainer.early_stop_patience=9", "checkpoint.every_n_steps=3",
                     "checkpoint.keep_best=1")  # fmt: skip
    assert json.loads((tmp_path / "checkpoints" / "best.json").read_text())["best"] == []
    again.fit()
    best = json.loads((tmp_path / "checkpoints" / "best.json").read_text())
    assert best["steps"] == [8], "the one validation since: step 8"


def test_a_resume_that_changes_a_torch_schedulers_settings_is_refused_or_takes_effect(tmp_path: Path) -> None:
    """StepLR's saved state would silently keep its old base rate and step_size: refused in one line, before
    anything is written; accepted, the scheduler starts afresh from them. The optimizer's own settings
    (weight_decay, momentum) are the config's whatever the checkpoint's optimizer state holds."""
    step_lr = ["optim=sgd", "scheduler._target_=torch.optim.lr_scheduler.StepLR", "+scheduler.step_size=2",
               "scheduler.warmup_steps=1", "checkpoint.every_n_steps=4"]  # fmt: skip
    relaunch(tmp_path, *step_lr, "trainer.max_steps=4").fit()
    metrics = (tmp_path / "metrics.jsonl").read_text()
    changed = [*step_lr, "trainer.max_steps=8", "optim.lr=0.02", "optim.weight_decay=0.01", "optim.momentum=0.5"]
    refusal = (r"^the checkpoint's scheduler was stepped with other settings \(optim.lr: checkpoint 0.1, config "
               r"0.02\): .*checkpoint.allow_changes=\[optim.lr\]$")  # fmt: skip
    with pytest.raises(ConfigError, match=refusal):
        relaunch(tmp_path, *changed)
    assert (tmp_path / "metrics.jsonl").read_text() == metrics, "nothing written"
    again = relaunch(tmp_path, *changed, "checkpoint.allow_changes=[optim.lr]")
    assert [(g["weight_decay"], g["momentum"]) for g in again.optimizer.param_groups] == [(0.01, 0.5), (0.0, 0.5)]
    again.fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in records if r["kind"] == "train" and r["step"] > 4] == pytest.approx([0.02, 0.02, 0.002,
                                                                                                  0.002])  # fmt: skip


def extra_set(seed: int, size: int) -> str:
    """A data set node of other synthetic images than the run's (its val set: the pair's second)."""
    return ("{_target_:{{cookiecutter.package_name}}.datasets.synthetic_images,num_classes:10,image_size:32,"
            f"train_size:1,val_size:{size},seed:{seed}}}")  # fmt: skip


EXTRA_SETS = ["trainer.max_steps=6", f"+data.val_sets.easy={extra_set(3, 13)}",
              f"+data.val_sets.hard={extra_set(4, 11)}"]  # fmt: skip


def test_named_validation_sets_are_each_evaluated_as_alone_and_the_monitor_may_rank_by_one(tmp_path: Path) -> None:
    from {{cookiecutter.package_name}}.engine.data.loader import eval_loader

    run = relaunch(tmp_path, *EXTRA_SETS, "checkpoint.keep_best=1", "checkpoint.monitor=val_hard_loss")
    run.fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    val = [record for record in records if record["kind"] == "val"]
    assert [record["step"] for record in val] == [2, 4, 6]
    assert {"val_loss", "val_acc", "val_easy_loss", "val_easy_acc", "val_hard_loss", "val_hard_acc"} <= set(val[-1])
    for name, dataset in (("easy", run.data.val_sets["easy"].dataset.dataset.base),
                          ("hard", run.data.val_sets["hard"].dataset.dataset.base)):  # fmt: skip
        alone = run.validate(eval_loader(dataset, run.config.data, CPU, run.config.seed)).metrics
        assert {f"val_{name}_{key}": value for key, value in alone.items()} == {
            key: value for key, value in val[-1].items() if key.startswith(f"val_{name}_")}, name  # fmt: skip
    assert len(run.data.val_sets["hard"].dataset) == 11 and val[-1]["val_samples"] == 16
    best = min(val, key=lambda record: record["val_hard_loss"])
    assert run.monitor.best == [(best["step"], best["val_hard_loss"])], "ranked by val_hard_loss"
    with pytest.raises(ConfigError, match="checkpoint.monitor=val_tough_loss is not a figure"):
        relaunch(tmp_path / "other", *EXTRA_SETS, "checkpoint.keep_best=1", "checkpoint.monitor=val_tough_loss")


def trained_and_tested(env: DistEnv, run_dir: Path) -> tuple[list[dict], int]:
    """A run whose monitor ranks a figure that gets worse (val_loss, max: the first validation's is the best) with
    a test set that is one of its validation sets too: its records, and the step it ended at."""
    config = to_train_config(compose_config([
        *TINY, "data.train_size=48", "data.global_batch_size=8", "trainer.val_every_n_steps=2", *EXTRA_SETS,
        f"+data.test_set={extra_set(4, 11)}", "checkpoint.keep_best=1", "checkpoint.mode=max"]))  # fmt: skip
    run = build_trainer(config, env, run_dir)
    run.fit()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()] if env.is_main else []
    return records, run.state.step


@pytest.mark.slow
def test_the_test_set_is_evaluated_once_at_the_end_with_the_best_weights_at_any_world_size(tmp_path: Path) -> None:
    records, last = trained_and_tested(CPU, tmp_path / "one")
    tests = [record for record in records if record["kind"] == "test"]
    assert len(tests) == 1 and records[-1] == tests[0], "once, at the end"
    val = {record["step"]: record for record in records if record["kind"] == "val"}
    best = max(val, key=lambda step: val[step]["val_loss"])
    assert best != last and tests[0]["step"] == best, "the best is not the last: its weights are tested"
    # The test set is validation set "hard" too: the best step's figures of it are those of the best weights.
    assert {key: tests[0][f"test_{key[9:]}"] for key in val[best] if key.startswith("val_hard_")} == {
        key: value for key, value in val[best].items() if key.startswith("val_hard_")}  # fmt: skip
    assert tests[0]["test_loss"] != val[last]["val_hard_loss"] and tests[0]["test_samples"] == 11
    # On two ranks (BatchNorm's statistics per rank train other weights): each evaluates its unpadded share of
    # the 11 samples, and the figures are still exactly those of its best weights over the whole set.
    (records, end), (_, end_of_rank_1) = on_ranks(2, trained_and_tested, tmp_path / "two")
    (test_on_two,) = [record for record in records if record["kind"] == "test"]
    val = {record["step"]: record for record in records if record["kind"] == "val"}
    best = max(val, key=lambda step: val[step]["val_loss"])
    assert end == end_of_rank_1 == last and best != last and test_on_two["step"] == best
    assert {key: test_on_two[f"test_{key[9:]}"] for key in val[best] if key.startswith("val_hard_")} == {
        key: value for key, value in val[best].items() if key.startswith("val_hard_")}  # fmt: skip
    assert test_on_two["test_samples"] == 11

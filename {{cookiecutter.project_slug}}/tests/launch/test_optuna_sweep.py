"""launch/optuna_sweep.py: a sweep whose trials Optuna's sampler asks for, rerun never."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.launch import job as job_module
from {{cookiecutter.package_name}}.launch.main import main

from ..helpers import TINY_JOB, quick_jobs


def test_an_optuna_sweep_asks_its_sampler_for_each_trial_and_names_the_best(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    calls: list[list[str]] = []
    monkeypatch.setattr(job_module, "torchrun", quick_jobs(calls))
    import optuna

    studies = []
    create_study = optuna.create_study
    monkeypatch.setattr(optuna, "create_study", lambda **kwargs: studies.append(create_study(**kwargs)) or studies[-1])
    space = ["hydra/sweeper=optuna", "hydra.sweeper.n_trials=3", "hydra.sweeper.direction=maximize",
             "optim.lr=tag(log,interval(0.01,0.3))", "optim.momentum=choice(0.8,0.9)"]  # fmt: skip
    command = ["single", "NPROC_PER_NODE=1", f"SWEEP_DIR={tmp_path / 'sweep'}", "-m", *space, *TINY_JOB]
    assert main(list(command)) == 0
    trials = [json.loads((tmp_path / "sweep" / f"00{i}_trial" / "sweep_point.json").read_text()) for i in range(3)]
    rates = [trial["params"]["optim.lr"] for trial in trials]
    assert all(0.01 <= rate <= 0.3 for rate in rates) and len(set(rates)) == 3
    assert {trial["params"]["optim.momentum"] for trial in trials} <= {0.8, 0.9}
    best = max(range(3), key=lambda i: rates[i])  # val_loss is the rate here, and the direction maximize
    assert f"best trial: {best} (" in capsys.readouterr().out
    told = [(trial.state, trial.value) for trial in studies[0].trials]  # the sampler learns from what it was told
    assert told == [(optuna.trial.TrialState.COMPLETE, rate) for rate in rates], "each trial's figure, told"
    calls.clear()
    assert main(list(command)) == 0 and calls == [], "finished trials are told to the study again, not rerun"
    again = [item.replace(str(tmp_path / "sweep"), str(tmp_path / "again")) for item in command]
    assert main(again) == 0 and len(calls) == 3
    again_dir = tmp_path / "again"
    trials_again = [json.loads((again_dir / f"00{i}_trial" / "sweep_point.json").read_text()) for i in range(3)]
    rates_again = [trial["params"]["optim.lr"] for trial in trials_again]
    assert rates_again == rates, "the sampler's seed (hydra.sweeper.seed): the same trials in a new sweep dir"
    with pytest.raises(SystemExit) as refused:
        main(["single", "-m", "hydra/sweeper=optuna", *TINY_JOB])
    assert refused.value.code == 2 and "found no search space" in capsys.readouterr().err


def test_hydras_search_spaces_become_optunas_distributions() -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from {{cookiecutter.package_name}}.launch.optuna_sweep import distribution

    spaces = ["a=int(interval(2,9))", "b=tag(log,interval(0.01,0.3))", "c=range(4,13,4)", "d=range(0.5,1.5,0.5)",
              "e=choice(sgd,adamw)"]  # fmt: skip
    got = [distribution(override) for override in OverridesParser.create().parse_overrides(spaces)]
    assert got == [IntDistribution(2, 9), FloatDistribution(0.01, 0.3, log=True), IntDistribution(4, 12, step=4),
                   CategoricalDistribution([0.5, 1.0]), CategoricalDistribution(["sgd", "adamw"])]  # fmt: skip


def test_the_best_trial_is_picked_among_the_trials_that_finished(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[list[str]] = []
    jobs = [quick_jobs(calls, code=1), quick_jobs(calls)]  # the first trial fails, leaving a figure behind
    monkeypatch.setattr(job_module, "torchrun", lambda *args, **kwargs: jobs[min(len(calls), 1)](*args, **kwargs))
    space = ["hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "hydra.sweeper.direction=maximize",
             "optim.lr=choice(0.3)"]  # fmt: skip
    assert main(["single", "NPROC_PER_NODE=1", f"SWEEP_DIR={tmp_path / 'sweep'}", "-m", *space, *TINY_JOB]) == 1
    assert len(calls) == 2 and "best trial: 1 (" in capsys.readouterr().out, "not the failed one, as good as it looks"

"""launch/sweep.py: a sweep's points, each trained once in its own run dir and tabulated; a stop signal
stops the sweep at its point (torchrun stood in for: tests/helpers.py's quick_jobs)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.launch import job as job_module
from {{cookiecutter.package_name}}.launch.keys import keys_of, parse_args, usage
from {{cookiecutter.package_name}}.launch.main import main
from {{cookiecutter.package_name}}.launch.modes import extra_modes
from {{cookiecutter.package_name}}.launch.supervise import Forwarder
from {{cookiecutter.package_name}}.launch.sweep import point_dir_name, results_table, sweep_points

from ..helpers import TINY_JOB, quick_jobs


def test_sweep_points_are_the_product_of_the_lists() -> None:
    points = sweep_points(["optim.lr=0.1,0.05", "model=small_cnn,resnet18", "trainer.epochs=1"])
    assert points == [
        ["optim.lr=0.1", "model=small_cnn", "trainer.epochs=1"],
        ["optim.lr=0.1", "model=resnet18", "trainer.epochs=1"],
        ["optim.lr=0.05", "model=small_cnn", "trainer.epochs=1"],
        ["optim.lr=0.05", "model=resnet18", "trainer.epochs=1"],
    ]
    table = results_table([{"point": 0, "overrides": ["optim.lr=0.1"], "status": "done", "reason": "",
                            "final": {"val_loss": 0.5, "val_acc": 0.9, "val_samples": 10}}])  # fmt: skip
    assert table.splitlines()[0] == "| point | overrides | status | val_loss | val_acc | val_samples |"
    assert table.splitlines()[1] == "| --- | --- | --- | --- | --- | --- |", "Markdown's header row"
    assert table.splitlines()[2] == "| 0 | optim.lr=0.1 | done | 0.5 | 0.9 | 10 |"
    # A point's run dir: its number, and its swept overrides (added, removed or set) in a name a shell takes.
    point = ["+Xy=1", "~c", "trainer.epochs=1", "d=a b/c"]
    assert point_dir_name(7, point, {"Xy", "c", "d"}) == "007_+Xy=1,_c,d=a_b_c"


def test_a_sweep_runs_each_point_once_in_its_own_run_dir_and_tabulates_them(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    calls: list[list[str]] = []
    monkeypatch.setattr(job_module, "torchrun", quick_jobs(calls))
    sweep_dir = tmp_path / "sweep"
    command = ["single", "NPROC_PER_NODE=1", f"SWEEP_DIR={sweep_dir}", "-m", "optim.lr=0.1,-1,0.05", *TINY_JOB]
    assert main(list(command)) == 1, "a failed point makes the sweep's exit code 1"
    assert calls == [["optim.lr=0.1", *TINY_JOB], ["optim.lr=0.05", *TINY_JOB]], "the refused point never started"
    points = sorted(path.name for path in sweep_dir.iterdir() if path.is_dir())
    assert points == ["000_optim.lr=0.1", "001_optim.lr=-1", "002_optim.lr=0.05"]
    status = [json.loads((sweep_dir / name / "sweep_point.json").read_text()) for name in points]
    assert [row["status"] for row in status] == ["done", "failed", "done"]
    assert status[1]["reason"].startswith("optim.lr must be a number > 0") and status[0]["final"]["val_loss"] == 0.1
    table = (sweep_dir / "results.md").read_text().splitlines()
    assert table[0] == "| point | overrides | status | val_loss | val_acc | val_samples |"
    assert table[2:] == ["| 0 | optim.lr=0.1 | done | 0.1 | 0.5 | 16 |",
                         "| 1 | optim.lr=-1 | failed (optim.lr must be a number > 0, got -1) |  |  |  |",
                         "| 2 | optim.lr=0.05 | done | 0.05 | 0.5 | 16 |"]  # fmt: skip
    capsys.readouterr()
    calls.clear()
    assert main(list(command)) == 1
    assert calls == [], "the points that finished are not trained again (and the refused one is refused again)"
    assert capsys.readouterr().out.count("done before, not trained again") == 2


@pytest.mark.parametrize(
    ("space", "first"),
    [(["optim.lr=0.1,0.05"], "000_optim.lr=0.1"),
     (["hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "optim.lr=interval(0.01,0.3)"], "000_trial")],
)  # fmt: skip
def test_a_sweep_stops_at_the_point_a_signal_stopped(tmp_path: Path, monkeypatch, capsys, space, first) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[list[str]] = []
    monkeypatch.setattr(job_module, "torchrun", quick_jobs(calls, code=128 + signal.SIGTERM))
    monkeypatch.setattr(Forwarder, "stopped_before_start", lambda self: None)
    original = Forwarder.__init__

    def signalled(self) -> None:  # the stop signal came during the first point's job
        original(self)
        self.signal = signal.SIGTERM

    monkeypatch.setattr(Forwarder, "__init__", signalled)
    sweep_dir = tmp_path / "sweep"
    code = main(["single", "NPROC_PER_NODE=1", f"SWEEP_DIR={sweep_dir}", "-m", *space, *TINY_JOB])
    assert code == 143 and len(calls) == 1, "the second point (or trial) never starts"
    assert f"sweep stopped by a signal: launch again with SWEEP_DIR={sweep_dir} to continue" in capsys.readouterr().out
    assert json.loads((sweep_dir / first / "sweep_point.json").read_text())["status"] == "stopped"
    assert not (sweep_dir / "results.md").exists()


def test_a_sweep_without_a_sweep_dir_gets_a_new_one_and_one_that_follows_the_config_is_refused(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[list[str]] = []
    monkeypatch.setattr(job_module, "torchrun", quick_jobs(calls))
    assert main(["single", "NPROC_PER_NODE=1", "-m", "optim.lr=0.1,0.05", *TINY_JOB]) == 0
    (made,) = (tmp_path / "outputs").iterdir()
    assert made.name.startswith("sweep_") and (made / "results.md").is_file() and len(calls) == 2
    with pytest.raises(SystemExit) as exited:
        main(["single", "SWEEP_DIR=outputs/${model._target_}", "-m", "optim.lr=0.1,0.05", *TINY_JOB])
    assert exited.value.code == 2 and len(calls) == 2
    assert capsys.readouterr().err == (
        "error: SWEEP_DIR=outputs/${model._target_}: a sweep dir holds the runs of several configs, so it cannot "
        "follow one (${...}): give a plain path\n"
    )


def test_a_sweeps_keys_without_m_are_refused_before_any_job(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[list[str]] = []
    monkeypatch.setattr(job_module, "torchrun", quick_jobs(calls))
    with pytest.raises(SystemExit) as exited:
        main(["single", "SUBMIT_ARGS=--time=10", *TINY_JOB])
    assert exited.value.code == 2 and calls == [] and not (tmp_path / "outputs").exists()
    assert capsys.readouterr().err == (
        "error: SUBMIT and SUBMIT_ARGS submit a sweep's points: give -m and a sweep, or leave them out\n"
    )


def test_run_single_takes_the_sweeps_keys_and_no_other_mode_does() -> None:
    assert [key.name for key in keys_of("single")][-3:] == ["SWEEP_DIR", "SUBMIT", "SUBMIT_ARGS"]
    assert "  SWEEP_DIR " in usage("single") and "-m/--multirun (a sweep" in usage("single")
    assert parse_args(["SWEEP_DIR=s", "-m", "optim.lr=1,2"], "single").keys == {"SWEEP_DIR": "s"}
    others = keys_of("multi") + [key for mode in extra_modes() for key in keys_of(mode)]
    assert not any(key.name.startswith(("SWEEP", "SUBMIT")) for key in others)

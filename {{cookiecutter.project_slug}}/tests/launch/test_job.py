"""launch/job.py: one launch holds a run dir at a time; the job's exit code follows what the workers said;
a job the workers refused leaves nothing behind."""

from __future__ import annotations

import os
import re
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.common.run_dir import (
    CONTROL_DIR_ENV,
    DEBUG_DIR_ENV,
    FAILED_MARKER,
    FINISHED_MARKER,
    REFUSED,
    STOPPED_MARKER,
)
from {{cookiecutter.package_name}}.launch import job as job_module
from {{cookiecutter.package_name}}.launch.job import lock_run_dir
from {{cookiecutter.package_name}}.launch.keys import LaunchArgs, LaunchError, parse_args
from {{cookiecutter.package_name}}.launch.plan import plan
from {{cookiecutter.package_name}}.launch.supervise import Forwarder


@pytest.fixture
def forwarder() -> Iterator[Forwarder]:
    """The launcher's signal forwarder, its handlers given back after the test."""
    forwarder = Forwarder()
    yield forwarder
    forwarder.close()


def test_a_run_dir_is_held_by_one_launch_at_a_time_and_freed_with_its_holder(tmp_path: Path) -> None:
    holder = lock_run_dir(tmp_path / "run")
    me = f"{socket.gethostname()} pid {os.getpid()}"
    try:
        with pytest.raises(LaunchError, match=rf"is in use by {re.escape(me)} since"):
            lock_run_dir(tmp_path / "run")
    finally:
        os.close(holder)
    os.close(lock_run_dir(tmp_path / "run"))


@pytest.mark.parametrize(
    ("markers", "torchrun_code", "signalled", "code", "said"),
    [
        ({FINISHED_MARKER: "48\n"}, 143, signal.SIGTERM, 0, "training had finished when SIGTERM came"),
        ({STOPPED_MARKER: "1\n"}, 1, 0, 129, ""),  # SIGHUP sent to torchrun itself, not to the launcher
        ({FAILED_MARKER: "nodes differ\n2\n"}, 1, 0, 2, "error: nodes differ (the traceback: "),
        ({FAILED_MARKER: ""}, 1, 0, 1, "error: a worker stopped the job without saying why"),
        ({}, 143, signal.SIGTERM, 143, ""),
    ],
)
def test_the_jobs_exit_code_follows_what_the_workers_said(tmp_path, capsys, markers, torchrun_code, signalled, code,
                                                          said) -> None:  # fmt: skip
    control, run_dir = tmp_path / "control", tmp_path / "run"
    control.mkdir()
    for name, text in markers.items():
        (control / name).write_text(text)
    forwarder = Forwarder()
    forwarder.signal = signalled
    try:
        assert job_module.job_exit_code(torchrun_code, run_dir, control, forwarder) == code
    finally:
        forwarder.close()
    printed = capsys.readouterr()
    assert said in printed.out + printed.err


@pytest.mark.parametrize("existing", [False, True])
def test_a_job_its_workers_refused_as_they_started_says_one_line_and_leaves_no_new_run_dir(
    tmp_path: Path, monkeypatch, capsys, existing: bool, forwarder: Forwarder
) -> None:
    """The workers' start checks (engine/assembly/checks.py) refuse through FAILED_MARKER with a third line: the
    launcher says the line alone, exits 2, and removes the run dir it made for the job (not one given)."""
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "given" if existing else None
    if existing:
        run_dir.mkdir()

    def refusing_workers(launch, module, arguments, forwarder, failed=None) -> int:
        (Path(launch.env[CONTROL_DIR_ENV]) / FAILED_MARKER).write_text(f"data.root=/x: no such folder\n2\n{REFUSED}\n")
        assert failed is not None and failed(), "the launcher stops the other workers at once"
        return 1

    monkeypatch.setattr(job_module, "torchrun", refusing_workers)
    launch = plan("single", parse_args(["NPROC_PER_NODE=1"], "single"), {"CUDA_VISIBLE_DEVICES": ""}, {})
    code = job_module.train(launch, LaunchArgs(overrides=["task=classification", "data=synthetic"]), run_dir, forwarder)
    assert code == 2
    printed = capsys.readouterr()
    assert printed.err == "error: data.root=/x: no such folder\n", printed.err
    assert "last evaluation" not in printed.out
    assert (
        (tmp_path / "given").is_dir()
        if existing
        else not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").iterdir())
    ), "a run dir made for a refused job is removed; a given one is kept"


def finishing_workers(seen: dict):
    """torchrun's stand-in: what it was handed, then a finished job's files (a validation, the marker)."""

    def torchrun(launch, module, arguments, forwarder, failed=None) -> int:
        control = Path(launch.env[CONTROL_DIR_ENV])
        run_dir = Path(arguments[0].removeprefix("hydra.run.dir=")[1:-1].replace("\\'", "'"))  # Hydra's quoting
        lock = run_dir / (".lock.node0" if launch.mode == "multi" else ".lock")
        seen.update(module=module, arguments=arguments, env=dict(launch.env), control=control, locked=lock.read_text(),
                    failed=failed())  # fmt: skip
        with pytest.raises(LaunchError, match="is in use by"):
            lock_run_dir(run_dir, lock.name)  # held for the whole job: a second launch is refused
        (run_dir / "metrics.jsonl").write_text('{"kind": "val", "step": 4, "val_loss": 0.5}\n'
                                               '{"kind": "train", "step": 5}\nnot json\n')  # fmt: skip
        (control / FINISHED_MARKER).write_text("5\n")
        return 0

    return torchrun


@pytest.mark.parametrize("mode", ["single", "multi"])
def test_a_job_runs_torchrun_on_its_locked_run_dir_and_ends_with_its_last_evaluation(
    tmp_path: Path, monkeypatch, capsys, mode: str, forwarder: Forwarder
) -> None:
    from ..helpers import free_port

    monkeypatch.chdir(tmp_path)
    seen: dict = {}
    monkeypatch.setattr(job_module, "torchrun", finishing_workers(seen))
    keys = ["NPROC_PER_NODE=1", "DEBUG=1"]
    if mode == "multi":
        keys += ["NODE_RANK=0", "NNODES=1", "MASTER_ADDR=127.0.0.1", f"MASTER_PORT={free_port()}"]
    launch = plan(mode, parse_args(keys, mode), {"CUDA_VISIBLE_DEVICES": ""}, {})
    run_dir = tmp_path / "it's, a=dir"
    overrides = ["task=classification", "data=synthetic"]
    assert job_module.train(launch, LaunchArgs(overrides=overrides), run_dir, forwarder) == 0
    assert seen["module"].endswith(".train") and seen["failed"] is False
    assert seen["arguments"] == ["hydra.run.dir='" + str(run_dir).replace("'", "\\'") + "'", *overrides]
    assert seen["locked"].startswith(f"{socket.gethostname()} pid {os.getpid()} since ")
    assert seen["env"][DEBUG_DIR_ENV] == str(run_dir.resolve() / "debug"), "DEBUG=1: the workers' debug dir"
    assert (run_dir / "debug").is_dir() and not seen["control"].exists(), "the control dir goes with the job"
    node = " (node 0)" if mode == "multi" else ""
    out = capsys.readouterr().out
    assert f"run dir: {run_dir}{node}\n" in out
    assert f"run dir: {run_dir}{node} (logs/, metrics.jsonl, checkpoints/)" in out
    assert out.strip().endswith('last evaluation: {"kind": "val", "step": 4, "val_loss": 0.5}')
    os.close(lock_run_dir(run_dir, ".lock.node0" if mode == "multi" else ".lock"))  # released at the end


def test_new_run_dirs_are_dated_and_never_one_that_exists(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    first, second = job_module.new_dir("many_"), job_module.new_dir("many_")
    assert re.fullmatch(r"outputs/many_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", str(first)), first
    assert first.is_dir() and second.is_dir() and second != first
    assert second.name == f"{first.name}_1" or second.name > first.name, "the same second: a suffix"
    job = job_module.new_dir()  # a job's run dir (train without RUN_DIR): the date alone
    assert re.fullmatch(r"outputs/\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", str(job)) and job.is_dir(), job


def test_the_run_dir_is_freed_when_the_job_ends_in_an_error(tmp_path: Path, monkeypatch, forwarder: Forwarder) -> None:
    def giving_up(launch, module, arguments, forwarder, failed=None) -> int:
        raise LaunchError("not all NNODES=2 nodes joined")  # as torchrun's supervision gives up on a rendezvous

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(job_module, "torchrun", giving_up)
    launch = plan("single", parse_args(["NPROC_PER_NODE=1"], "single"), {"CUDA_VISIBLE_DEVICES": ""}, {})
    with pytest.raises(LaunchError, match="not all NNODES=2 nodes joined"):
        job_module.train(launch, LaunchArgs(overrides=["task=classification"]), tmp_path / "run", forwarder)
    os.close(lock_run_dir(tmp_path / "run"))  # free again in this process: a later launch may take it

"""launch/job.py: one launch holds a run dir at a time; the job's exit code follows what the workers said;
a job the workers refused leaves nothing behind."""

from __future__ import annotations

import os
import re
import signal
import socket
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.launch import job as job_module
from {{cookiecutter.package_name}}.launch.job import lock_run_dir
from {{cookiecutter.package_name}}.launch.keys import LaunchArgs, LaunchError, parse_args
from {{cookiecutter.package_name}}.launch.plan import plan
from {{cookiecutter.package_name}}.launch.supervise import Forwarder
from {{cookiecutter.package_name}}.run_dir import CONTROL_DIR_ENV, FAILED_MARKER, FINISHED_MARKER, REFUSED, STOPPED_MARKER


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
    tmp_path: Path, monkeypatch, capsys, existing: bool
) -> None:
    """The workers' start checks (engine/checks.py) refuse through FAILED_MARKER with a third line: the
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
    code = job_module.train(
        launch, LaunchArgs(overrides=["task=classification", "data=synthetic"]), run_dir, Forwarder()
    )
    assert code == 2
    printed = capsys.readouterr()
    assert printed.err == "error: data.root=/x: no such folder\n", printed.err
    assert "last evaluation" not in printed.out
    assert (
        (tmp_path / "given").is_dir()
        if existing
        else not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").iterdir())
    ), "a run dir made for a refused job is removed; a given one is kept"

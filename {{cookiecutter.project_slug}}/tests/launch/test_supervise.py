"""launch/supervise.py: a stop signal that comes before torchrun starts means it never does."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from {{cookiecutter.package_name}}.launch import job as job_module
from {{cookiecutter.package_name}}.launch import main as launch_module
from {{cookiecutter.package_name}}.launch.main import main


@pytest.mark.parametrize(("mode", "signum"), [("single", signal.SIGTERM), ("single", signal.SIGINT),
                                              ("single", signal.SIGHUP), ("comm", signal.SIGTERM)])  # fmt: skip
def test_a_signal_during_the_checks_stops_the_launch_before_torchrun(monkeypatch, capsys, tmp_path, mode, signum):
    monkeypatch.chdir(tmp_path)
    real_popen = subprocess.Popen

    def no_torchrun(command, *args, **kwargs):
        assert not any(str(part).endswith(".agent") for part in command), "torchrun started"
        return real_popen(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", no_torchrun)
    # the checks, where their caller looks them up: job.train calls preflight, main.launch_main check_comm_config
    module, name = (job_module, "preflight") if mode == "single" else (launch_module, "check_comm_config")
    checks = getattr(module, name)

    def interrupted_checks(*args, **kwargs):  # the signal arrives while the launcher still checks
        os.kill(os.getpid(), signum)
        return checks(*args, **kwargs)

    monkeypatch.setattr(module, name, interrupted_checks)
    code = main([mode, "NPROC_PER_NODE=1", "task=classification", "data=synthetic", "model=small_cnn"])
    assert code == 128 + signum, "nothing was trained"
    name = signal.Signals(signum).name
    assert capsys.readouterr().err == f"stopped by {name} before torchrun started: nothing was trained\n"
    assert not (tmp_path / "outputs").exists(), "no run dir for a launch that never started"

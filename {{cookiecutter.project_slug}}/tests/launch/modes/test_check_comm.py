"""launch/modes/check_comm.py: scripts/check_comm.sh's launch, the launcher's keys of one node or of many, two
processes on CPUs and no restart, its config checked before torchrun and a stop signal honoured while it is
(the check itself: tests/test_comm_check.py; through the script on two nodes: tests/e2e/test_comm_check.py)."""

from __future__ import annotations

import os
import signal

import pytest

from {{cookiecutter.package_name}}.launch import plan as plan_module
from {{cookiecutter.package_name}}.launch.keys import LaunchError
from {{cookiecutter.package_name}}.launch.main import main
from {{cookiecutter.package_name}}.launch.modes import check_comm

from ...helpers import forbid_torchrun, planned, run


def test_two_processes_share_the_cores_of_a_cpu_machine_and_never_restart(monkeypatch) -> None:
    monkeypatch.setattr(plan_module, "cpu_cores", lambda: 8)
    checked = planned("comm")  # a communication check needs two processes
    assert checked.nproc == 2 and checked.env["OMP_NUM_THREADS"] == "4"
    assert "--max-restarts=0" in checked.torchrun_args and "--standalone" in checked.torchrun_args


def test_given_a_node_rank_the_check_spans_the_nodes_and_takes_no_key_of_a_training() -> None:
    across = planned("comm", "NODE_RANK=1", "NNODES=2", "MASTER_ADDR=127.0.0.1")
    assert "--standalone" not in across.torchrun_args and "--node-rank=1" in across.torchrun_args
    with pytest.raises(LaunchError, match="unknown key RUN_DIR"):
        planned("comm", "NODE_RANK=0", "RUN_DIR=x")


@pytest.mark.parametrize(("overrides", "message"), [(["dist.backend=nccl"], "dist.backend=nccl needs a GPU"),
                                                    (["dist.timeout_s=0"], "dist.timeout_s must be > 0")])  # fmt: skip
def test_a_bad_override_is_refused_in_one_line_before_torchrun(monkeypatch, capsys, overrides, message) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    started = []
    monkeypatch.setattr(check_comm, "torchrun", lambda *args, **kwargs: started.append(args) or 0)
    with pytest.raises(SystemExit) as exited:
        main(["comm", "NPROC_PER_NODE=2", *overrides])
    assert exited.value.code == 2 and not started
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_a_signal_during_the_checks_stops_the_check_before_torchrun(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    forbid_torchrun(monkeypatch)
    checks = check_comm.checked_config

    def interrupted_checks(*args, **kwargs):  # the signal arrives while the launcher still checks
        os.kill(os.getpid(), signal.SIGTERM)
        return checks(*args, **kwargs)

    monkeypatch.setattr(check_comm, "checked_config", interrupted_checks)
    assert main(["comm", "NPROC_PER_NODE=1", "task=classification", "data=synthetic"]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == "stopped by SIGTERM before torchrun started: nothing was trained\n"


def test_the_script_hands_its_keys_to_the_launcher_and_a_bad_one_is_one_line() -> None:
    proc = run(["bash", "scripts/check_comm.sh", "FOO=1"], expect_ok=False, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: unknown key FOO") and "Traceback" not in proc.stdout + proc.stderr

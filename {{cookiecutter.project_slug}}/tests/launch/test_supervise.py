"""launch/supervise.py: a stop signal that comes before torchrun starts means it never does; one that
comes while it runs is passed on to it; a worker's error no restart can fix kills it at once, and so
does node 0 having stopped, on the other nodes."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.launch import job as job_module
from {{cookiecutter.package_name}}.launch.keys import LaunchError
from {{cookiecutter.package_name}}.launch.main import main
from {{cookiecutter.package_name}}.launch.rendezvous import NodeZeroWatch
from {{cookiecutter.package_name}}.launch.supervise import FORWARDED_SIGNALS, Forwarder

from ..helpers import forbid_torchrun, free_port


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_during_the_checks_stops_the_launch_before_torchrun(monkeypatch, capsys, tmp_path, signum) -> None:
    monkeypatch.chdir(tmp_path)
    forbid_torchrun(monkeypatch)
    checks = job_module.preflight  # where its caller looks it up: job.train calls preflight

    def interrupted_checks(*args, **kwargs):  # the signal arrives while the launcher still checks
        os.kill(os.getpid(), signum)
        return checks(*args, **kwargs)

    monkeypatch.setattr(job_module, "preflight", interrupted_checks)
    code = main(["single", "NPROC_PER_NODE=1", "task=classification", "data=synthetic", "model=small_cnn"])
    assert code == 128 + signum, "nothing was trained"
    name = signal.Signals(signum).name
    assert capsys.readouterr().err == f"stopped by {name} before torchrun started: nothing was trained\n"
    assert not (tmp_path / "outputs").exists(), "no run dir for a launch that never started"


def test_a_signal_while_a_node_waits_for_node_zero_ends_the_wait_at_once(monkeypatch, capsys, tmp_path) -> None:
    """Ctrl-C on a node waiting for node 0's port: it stops then, not once WAIT_FOR_MASTER_S is over."""
    monkeypatch.chdir(tmp_path)
    forbid_torchrun(monkeypatch)

    def not_there_yet(*args, **kwargs):  # node 0 not listening yet, and the signal arrives while this node waits
        os.kill(os.getpid(), signal.SIGINT)
        raise ConnectionRefusedError

    monkeypatch.setattr(socket, "create_connection", not_there_yet)
    started = time.monotonic()
    code = main(["multi", "NODE_RANK=1", "MASTER_ADDR=127.0.0.1", f"MASTER_PORT={free_port()}", "WAIT_FOR_MASTER_S=60",
                 "NPROC_PER_NODE=1", "task=classification", "data=synthetic", "model=small_cnn"])  # fmt: skip
    assert code == 130 and time.monotonic() - started < 10
    assert capsys.readouterr().err == "stopped by SIGINT before torchrun started: nothing was trained\n"


@pytest.mark.parametrize("written", [False, True], ids=["nothing written", "logs written"])
def test_a_stop_before_the_workers_wrote_anything_is_one_line_and_leaves_no_run_dir(
    monkeypatch, capsys, tmp_path, written: bool
) -> None:
    """A stop signal while torchrun runs, before the workers wrote anything in the new run dir (torch's import,
    the rendezvous, the config's composition): nothing was trained, said in one line, and the run dir made for
    the launch goes. Once they have written, the run dir stays and the launcher names it."""
    monkeypatch.chdir(tmp_path)

    def stopped_torchrun(launch, module, arguments, forwarder, failed=None) -> int:
        forwarder.signal = signal.SIGINT  # as the launcher's handler records Ctrl-C, then passes it on
        if written:
            run_dir = Path(arguments[0].split("=", 1)[1].strip("'"))
            (run_dir / "logs").mkdir()
        return 128 + signal.SIGINT

    monkeypatch.setattr(job_module, "torchrun", stopped_torchrun)
    code = main(["single", "NPROC_PER_NODE=1", "RUN_DIR=run", "task=classification", "data=synthetic",
                 "model=small_cnn"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 130 and (tmp_path / "run").exists() == written
    said = "stopped by SIGINT before training started: nothing was trained\n"
    assert (said in err) != written, err


TORCHRUN = [sys.executable, "-c", "import time; time.sleep(30)"]  # torchrun's stand-in: runs until stopped


def ended(forwarder: Forwarder) -> int | None:
    """The stand-in's exit code (-N: signal N ended it), once it ended; one still running is killed first."""
    forwarder.close()
    if forwarder.child is not None and forwarder.child.poll() is None:
        forwarder.child.kill()
        forwarder.child.wait()
    return None if forwarder.child is None else forwarder.child.returncode


# torchrun's stand-ins that make the file named by their argument once they run (a busy machine starts Python slowly,
# and a SIGINT amid Python's start is a KeyboardInterrupt, exit code 1): one ended by a stop signal itself, as the
# agent is before it starts the workers (launch/agent.py), and one whose handler ends it with 128 + the signal, as
# torchrun's handlers do once they have.
STARTING = "import sys, time\nopen(sys.argv[1], 'w').close()\ntime.sleep(30)"
WITH_WORKERS = (
    "import signal, sys\nfor sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
    "    signal.signal(sig, lambda signum, _: sys.exit(128 + signum))\n" + STARTING
)


@pytest.mark.parametrize("workers", [False, True], ids=["before the workers", "with the workers"])
@pytest.mark.parametrize("signum", FORWARDED_SIGNALS, ids=lambda signum: signum.name)
def test_a_stop_signal_to_the_launcher_is_passed_on_to_the_running_torchrun(
    signum: int, workers: bool, tmp_path
) -> None:
    """torchrun (its own process group: the terminal's Ctrl-C does not reach it) gets the launcher's
    signal, the same one; the launcher's code says which (128 + it), and whether it ended torchrun before it
    started the workers (launch/job.py then says that nothing was trained)."""
    forwarder = Forwarder()
    running = tmp_path / "running"
    asked: list[int] = []

    def signal_while_it_runs() -> bool:  # asked every 0.2 s while torchrun runs
        if not running.exists():
            return False
        asked.append(1)
        if len(asked) == 1:
            os.kill(os.getpid(), signum)
        return len(asked) > 10  # not passed on: give up after 2 s (the stand-in killed)

    try:
        torchrun = [sys.executable, "-c", WITH_WORKERS if workers else STARTING, str(running)]
        code = forwarder.run(torchrun, dict(os.environ), signal_while_it_runs)
    finally:
        returncode = ended(forwarder)
    ended_by = (128 + signum, False) if workers else (-signum, True)  # its own handler, or the signal itself
    assert (code, returncode, forwarder.before_workers) == (128 + signum, *ended_by)


def test_a_worker_error_no_restart_can_fix_kills_torchrun_at_once() -> None:
    """`failed` true (a worker's FAILED_MARKER): torchrun is killed before it restarts anyone, and waited for."""
    forwarder = Forwarder()
    try:
        code = forwarder.run(TORCHRUN, dict(os.environ), failed=lambda: True)
        assert forwarder.child is not None and forwarder.child.returncode == -signal.SIGKILL, "killed and waited for"
    finally:
        ended(forwarder)
    assert code == 1


# torchrun's stand-in that takes 2.5 s to stop; it makes the file named by its argument once it listens
STOPS_SLOWLY = (
    "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(2.5), sys.exit(0)))\n"
    "open(sys.argv[1], 'w').close()\ntime.sleep(30)"
)
CHECKPOINTING_TORCHRUN = [sys.executable, "-c", f"import signal, sys, time\n{STOPS_SLOWLY}"]


@pytest.mark.slow
@pytest.mark.parametrize("told_to_stop", [False, True], ids=["node 0 alone stopped", "this node told to stop too"])
def test_node_zero_having_stopped_kills_torchrun_on_the_other_nodes_in_seconds(told_to_stop: bool, tmp_path) -> None:
    """Node 0 refused the job (or died) while this node's workers wait for it: not until dist.timeout_s but
    seconds after, one line. A node sent a stop signal itself goes on stopping as it was told."""
    node_zero = socket.create_server(("127.0.0.1", 0))
    port = node_zero.getsockname()[1]
    watch = NodeZeroWatch({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": "1"}, every_s=0.1,
                          gone_after_s=1.0)  # fmt: skip

    def node_zero_stops() -> bool:  # asked every 0.2 s while torchrun runs
        if told_to_stop and not (tmp_path / "listening").exists():  # a busy machine starts Python slowly
            return False
        if node_zero.fileno() != -1:
            node_zero.close()
            if told_to_stop:
                os.kill(os.getpid(), signal.SIGTERM)
        return False

    forwarder = Forwarder()
    started = time.monotonic()
    try:
        if told_to_stop:  # torchrun's stand-in takes 2.5 s to stop (its workers' last checkpoint): left to it
            torchrun = [*CHECKPOINTING_TORCHRUN, str(tmp_path / "listening")]
            code = forwarder.run(torchrun, dict(os.environ), node_zero_stops, node_zero=watch)
            assert code == 128 + signal.SIGTERM and forwarder.child is not None and forwarder.child.returncode == 0
        else:
            with pytest.raises(LaunchError, match=f"^node 0 has stopped: nothing answers at 127.0.0.1:{port} any more"):
                forwarder.run(TORCHRUN, dict(os.environ), node_zero_stops, node_zero=watch)
            assert forwarder.child is not None and forwarder.child.returncode == -signal.SIGKILL, "killed, waited for"
    finally:
        ended(forwarder)
    assert time.monotonic() - started < 10

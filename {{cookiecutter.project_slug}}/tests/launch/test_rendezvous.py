"""launch/rendezvous.py: node 0's port is free, the other nodes wait for node 0 a bounded time, and
tell when node 0 has stopped."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from {{cookiecutter.package_name}}.launch.keys import LaunchError
from {{cookiecutter.package_name}}.launch.rendezvous import (
    NodeWait,
    NodeZeroWatch,
    check_rendezvous,
    has_children,
    require_free_port,
)

from ..helpers import free_port, planned


def test_a_taken_port_is_refused_on_node_zero() -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LaunchError, match=f"MASTER_PORT={port} is already in use on this machine"):
            require_free_port(port)


def test_node_zero_refuses_a_master_port_in_use_before_torchrun() -> None:
    # In-process twin of tests/e2e/test_multinode.py's script test: check_rendezvous must ask for the port.
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        launch = planned("multi", "NODE_RANK=0", f"MASTER_PORT={port}", "NPROC_PER_NODE=1")
        with pytest.raises(LaunchError, match=f"MASTER_PORT={port} is already in use on this machine"):
            check_rendezvous(launch)


def test_other_nodes_wait_for_node_zero_a_bounded_time_then_give_a_hint() -> None:
    port = free_port()  # nobody listens there
    launch = planned("multi", "NODE_RANK=1", "MASTER_ADDR=127.0.0.1", f"MASTER_PORT={port}", "WAIT_FOR_MASTER_S=1",
                     "NPROC_PER_NODE=1")  # fmt: skip
    started = time.monotonic()
    with pytest.raises(LaunchError) as error:
        check_rendezvous(launch)
    assert f"node 0 is not reachable at 127.0.0.1:{port} after 1 s" in str(error.value)
    assert f"nc -zv 127.0.0.1 {port}" in str(error.value) and time.monotonic() - started < 15


def listening(port: int = 0) -> socket.socket:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen()
    return server


def test_node_zero_is_gone_once_its_port_has_not_answered_for_a_while_not_at_a_blip() -> None:
    server = listening()
    port = server.getsockname()[1]
    watch = NodeZeroWatch({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": "2"}, every_s=0.1,
                          gone_after_s=1.0)  # fmt: skip
    assert not watch.gone(100.0), "node 0 answers"
    server.close()
    assert not watch.gone(100.05), "probed every 0.1 s: not yet"
    assert not watch.gone(100.2) and not watch.gone(101.1), "not answering for 0.9 s: a blip, maybe"
    server = listening(port)  # it answers again: the count starts afresh
    assert not watch.gone(101.3)
    server.close()
    assert not watch.gone(102.0) and watch.gone(103.0)
    assert watch.give_up() == (
        f"node 0 has stopped: nothing answers at 127.0.0.1:{port} any more, so node 2 stops too; node 0's output "
        "says why: launch every node again once it is fixed"
    )


def test_a_process_whose_threads_come_and_go_has_no_children_until_it_starts_one() -> None:
    # torchrun's threads come and go while it waits for the other nodes: one ending as it was read
    # once counted as "has children" (the workers started), and a node alone then waited for ever.
    script = (
        "import subprocess, sys, threading, time\n"
        "def churn():\n"
        "    while True:\n"
        "        t = threading.Thread(target=time.sleep, args=(0.0005,)); t.start(); t.join()\n"
        "threading.Thread(target=churn, daemon=True).start()\n"
        "sys.stdin.readline(); subprocess.Popen(['sleep', '30']); time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        assert not any(has_children(proc.pid) for _ in range(3000))
        proc.stdin.write("start one\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 10
        while not has_children(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert has_children(proc.pid)
    finally:
        subprocess.run(["pkill", "-P", str(proc.pid)])
        proc.kill()
        proc.wait()


def test_a_node_says_once_after_10_s_that_it_waits_for_the_others_and_gives_up_at_its_limit(capsys) -> None:
    values = {"NNODES": "3", "NODE_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
              "WAIT_FOR_NODES_S": "60"}  # fmt: skip
    wait = NodeWait(values)
    assert [wait.overdue(waited) for waited in (0.0, 9.9)] == [False, False] and capsys.readouterr().out == ""
    assert [wait.overdue(waited) for waited in (10.0, 30.0, 59.9)] == [False, False, False]
    assert capsys.readouterr().out == (
        "waiting for all of NNODES=3 nodes to join at 10.0.0.1:29500 (up to WAIT_FOR_NODES_S=60 s)\n"
    ), "said once"
    assert wait.overdue(60.0)
    short = NodeWait({**values, "WAIT_FOR_NODES_S": "4"})  # a limit under 10 s: said at the limit
    assert short.overdue(4.0) and "up to WAIT_FOR_NODES_S=4 s" in capsys.readouterr().out


def test_a_child_of_a_moment_does_not_end_the_wait_children_that_stay_do() -> None:
    """torchrun's import runs `ldconfig -p` as a child for milliseconds: a node that took it for its workers
    stopped waiting, and a node alone then waited for ever instead of giving up at WAIT_FOR_NODES_S."""
    wait = NodeWait({"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
                     "WAIT_FOR_NODES_S": "600"})  # fmt: skip
    polls = [(0.0, False), (0.2, True), (0.4, False), (0.6, False)]  # a child of a moment
    assert not any(wait.joined(children, now) for now, children in polls)
    assert [wait.joined(True, now) for now in (1.0, 1.2, 1.8, 2.0)] == [False, False, False, True]

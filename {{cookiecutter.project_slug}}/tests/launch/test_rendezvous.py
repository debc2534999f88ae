"""launch/rendezvous.py: node 0's port is free, the other nodes wait for node 0 a bounded time."""

from __future__ import annotations

import socket
import time

import pytest

from {{cookiecutter.package_name}}.launch.keys import LaunchError
from {{cookiecutter.package_name}}.launch.rendezvous import check_rendezvous, require_free_port

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

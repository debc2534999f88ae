"""launch/agent.py: torchrun's stores listen where the launcher says (loopback for a job on one node);
its exit barrier fails in silence once node 0 has gone."""

from __future__ import annotations

import datetime
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.agent.server import api as agent_api

from {{cookiecutter.package_name}}.launch.agent import quiet_exit_barrier, stop_once, stores_listening_on


def listening(port: int) -> set[str]:
    """The local addresses sockets listen on at `port` (Linux's /proc/net tables, hex encoded)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


@pytest.mark.parametrize(("address", "table_entry"), [("127.0.0.1", "0100007F"), ("::1", "0" * 24 + "01000000")])
def test_a_store_server_listens_on_the_given_address_alone_and_clients_reach_it(address, table_entry) -> None:
    """An IPv4 or an IPv6 address (a node's LOCAL_ADDR may be either), each bound with its own family."""
    server = stores_listening_on(address)(address, 0, is_master=True, multi_tenant=True,
                                          timeout=datetime.timedelta(seconds=10))  # fmt: skip
    assert listening(server.port) == {table_entry}, f"{address} only, not 0.0.0.0 or ::"
    client = stores_listening_on(address)(address, server.port, is_master=False,
                                          timeout=datetime.timedelta(seconds=10))  # fmt: skip
    client.set("key", "value")
    assert server.get("key") == b"value"


@pytest.mark.parametrize("quiet", [True, False])
def test_the_exit_barrier_fails_without_a_traceback_once_node_zero_has_gone(quiet, caplog) -> None:
    """A node whose workers ended waits in torchrun's exit barrier, on node 0's store. Node 0's launcher
    has stopped its agent (a worker refused the job): the wait fails, and says nothing under the launcher's
    line (CI saw torchrun's traceback there). Without the filter, the same failure logs its traceback."""
    timeout = datetime.timedelta(seconds=5)
    node_zero = TCPStore("127.0.0.1", 0, is_master=True, timeout=timeout)
    store = TCPStore("127.0.0.1", node_zero.port, is_master=False, timeout=timeout)
    del node_zero  # node 0's agent has ended, and its store with it
    agent = SimpleNamespace(_store=store, _exit_barrier_timeout=5, _in_exit_barrier=False,
                            _worker_group=SimpleNamespace(group_world_size=2, state="SUCCEEDED"))  # fmt: skip
    filters = list(agent_api.logger.filters)
    try:
        if quiet:
            quiet_exit_barrier()
        with caplog.at_level(logging.INFO, logger=agent_api.logger.name):
            agent_api.SimpleElasticAgent._exit_barrier(agent)  # type: ignore[arg-type]
    finally:
        agent_api.logger.filters[:] = filters
    failures = [record for record in caplog.records if record.exc_info]
    assert (failures == []) == quiet, [record.getMessage() for record in caplog.records]
    assert any("Waiting 5 seconds for other agents" in record.getMessage() for record in caplog.records)


def test_a_stop_signal_is_raised_once_and_a_repeat_while_it_is_handled_is_ignored(monkeypatch) -> None:
    from torch.distributed.elastic.multiprocessing import api as processes_api
    from torch.distributed.elastic.multiprocessing.api import SignalException

    monkeypatch.setattr(processes_api, "_terminate_process_handler", processes_api._terminate_process_handler)
    stop_once()
    stop_once()  # twice (a relaunched agent's module state): still one wrapper
    handler = processes_api._terminate_process_handler
    with pytest.raises(SignalException) as raised:
        handler(signal.SIGTERM, None)
    assert raised.value.sigval == signal.SIGTERM
    assert handler(signal.SIGTERM, None) is None and handler(signal.SIGINT, None) is None, "ignored: no second raise"


def test_run_as_the_agent_sigint_takes_its_default_action_from_before_torchs_import() -> None:
    """A stop signal ends the agent at once until torchrun's handlers go in with the workers: torch's import and
    the rendezvous's wait included, not a KeyboardInterrupt that waits for the C++ call, then a traceback (the
    job's line: tests/e2e/test_multinode.py). Read from the kernel while the agent imports torch."""
    agent = subprocess.Popen([sys.executable, "-m", "{{cookiecutter.package_name}}.launch.agent", "--help"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "libtorch" not in Path(f"/proc/{agent.pid}/maps").read_text():  # past the agent's first lines
            assert agent.poll() is None and time.monotonic() < deadline, "the agent ended before torch loaded"
            time.sleep(0.005)
        status = Path(f"/proc/{agent.pid}/status").read_text().splitlines()
        caught = int(next(line for line in status if line.startswith("SigCgt:")).split()[1], 16)
        assert not caught & 1 << (signal.SIGINT - 1), "SIGINT is caught: Python's KeyboardInterrupt"
    finally:
        agent.kill()
        agent.wait()

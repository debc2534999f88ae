"""launch/agent.py: torchrun's stores listen where the launcher says (loopback for a job on one node)."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.launch.agent import stores_listening_on


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

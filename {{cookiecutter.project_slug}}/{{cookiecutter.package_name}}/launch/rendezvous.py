"""The nodes' meeting point: node 0 must own MASTER_PORT and the other nodes wait for it (bounded), a node
waits a bounded, spoken time for all the nodes to join torchrun's rendezvous (NodeWait), and the other nodes
stop soon after node 0 has stopped (NodeZeroWatch); docs/launching.md."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .keys import LaunchError
from .plan import Launch


def require_free_port(port: int) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            raise LaunchError(
                f"MASTER_PORT={port} is already in use on this machine: pick another, e.g. MASTER_PORT={port + 1}"
            ) from None


def check_rendezvous(launch: Launch, stopped: Callable[[], bool] = lambda: False) -> None:
    """Node 0 must own MASTER_PORT; the other nodes wait for it (bounded), then a hint; a stop signal (`stopped`)
    ends the wait at once, for the launcher to say."""
    if "--standalone" in launch.torchrun_args:
        return
    values = launch.values
    if values["NODE_RANK"] == "0":
        require_free_port(int(values["MASTER_PORT"]))
        return
    address, port, seconds = values["MASTER_ADDR"], int(values["MASTER_PORT"]), int(values["WAIT_FOR_MASTER_S"])
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((address, port), timeout=2).close()
            return
        except OSError:
            if stopped():
                return
            if time.monotonic() >= deadline:
                raise LaunchError(
                    f"node 0 is not reachable at {address}:{port} after {seconds} s: start node 0 first, check "
                    f"MASTER_ADDR and MASTER_PORT, and test with: nc -zv {address} {port}"
                ) from None
            time.sleep(1)


@dataclass
class NodeWait:
    """A node's bounded, spoken wait for the others to join the rendezvous."""

    values: dict[str, str]
    done: bool = False
    told: bool = False
    steady_s: float = 1.0  # how long torchrun's children must stay to be its workers
    children_since: float | None = None

    def joined(self, has_children: bool, now: float) -> bool:
        """Whether torchrun has started its workers (once all nodes came): children seen for `steady_s` on end,
        not a child of a moment (torch's import runs `ldconfig -p`: a node alone took it and waited for ever)."""
        if not has_children:
            self.children_since = None
            return False
        if self.children_since is None:
            self.children_since = now
        return now - self.children_since >= self.steady_s

    def overdue(self, waited: float) -> bool:
        limit = int(self.values["WAIT_FOR_NODES_S"])
        if not self.told and waited >= min(10.0, limit):
            self.told = True
            print(f"waiting for all of NNODES={self.values['NNODES']} nodes to join at {self.values['MASTER_ADDR']}:"
                  f"{self.values['MASTER_PORT']} (up to WAIT_FOR_NODES_S={limit} s)", flush=True)  # fmt: skip
        return waited >= limit

    def give_up(self) -> str:
        return (
            "not all NNODES={NNODES} nodes joined node {NODE_RANK}'s rendezvous at {MASTER_ADDR}:{MASTER_PORT} within "
            "WAIT_FOR_NODES_S={WAIT_FOR_NODES_S} s: start the others with the same command and their NODE_RANK, or "
            "lower NNODES"
        ).format_map(self.values)


@dataclass
class NodeZeroWatch:
    """A node other than 0 watches node 0's MASTER_PORT while its job runs. Node 0's torchrun serves the
    job's store there until every node's workers have ended: once nothing answers for `gone_after_s`, node 0
    has stopped, whatever stopped it, and this node's workers would wait for it until dist.timeout_s."""

    values: dict[str, str]
    every_s: float = 1.0
    gone_after_s: float = 5.0  # a moment of a busy network is not a node gone
    probed: float = float("-inf")
    unanswered_since: float | None = None

    def gone(self, now: float) -> bool:
        """Whether node 0 has not answered for `gone_after_s` (probed every `every_s`)."""
        if now - self.probed < self.every_s:
            return False
        self.probed = now
        try:
            socket.create_connection((self.values["MASTER_ADDR"], int(self.values["MASTER_PORT"])), timeout=1).close()
            self.unanswered_since = None
        except OSError:
            self.unanswered_since = now if self.unanswered_since is None else self.unanswered_since
        return self.unanswered_since is not None and now - self.unanswered_since >= self.gone_after_s

    def give_up(self) -> str:
        return (
            "node 0 has stopped: nothing answers at {MASTER_ADDR}:{MASTER_PORT} any more, so node {NODE_RANK} stops "
            "too; node 0's output says why: launch every node again once it is fixed"
        ).format_map(self.values)


def has_children(pid: int) -> bool:
    """Whether a process has children (Linux: /proc); True where that cannot be told. A thread that ends
    between the listing and the read is skipped: read as "has children", it ended the node's wait for good."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return True
    for task in tasks:
        with contextlib.suppress(OSError):  # that thread has ended
            if (task / "children").read_text().strip():
                return True
    return False

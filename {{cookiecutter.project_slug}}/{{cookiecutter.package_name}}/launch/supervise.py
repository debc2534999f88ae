"""torchrun as the launcher's child: in a process group of its own that dies with the launcher, sent the
stop signals the launcher receives, killed when a worker reports an error no restart can fix or when the
nodes do not all come (docs/launching.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from types import FrameType

from ..common.errors import say
from ..common.processes import own_group_dying_with_parent
from .keys import LaunchError
from .plan import Launch
from .rendezvous import NodeWait, NodeZeroWatch, has_children

PACKAGE = __package__.split(".")[0]  # the import name of the package the launch starts: its train, a mode's own

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Forwarder:
    """From the launcher's start: remembers the first SIGTERM, SIGINT or SIGHUP (a closed terminal)
    and passes it on to torchrun while it runs. A signal before torchrun starts means it never does."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.signal = 0  # the first stop signal this launcher received: its exit code says which
        self.before_workers = False  # whether that signal ended torchrun before it started the workers
        self.previous = {sig: signal.signal(sig, self.handle) for sig in FORWARDED_SIGNALS}

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.signal = self.signal or signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def stopped_before_start(self) -> int | None:
        """128 + the signal if one came before torchrun started (said in one line), else None."""
        if not self.signal:
            return None
        say(f"stopped by {signal.Signals(self.signal).name} before torchrun started: nothing was trained", err=True)
        return 128 + self.signal

    def run(self, command: list[str], env: dict[str, str], failed: Callable[[], bool] = lambda: False,
            nodes: NodeWait | None = None, node_zero: NodeZeroWatch | None = None) -> int:  # fmt: skip
        """torchrun until it ends, or until a worker reports an error no restart can fix (`failed`), the
        nodes did not all come (`nodes`) or node 0 has stopped (`node_zero`, unless this node was told to
        stop too): then torchrun is killed, and its workers die with it."""
        if (code := self.stopped_before_start()) is not None:
            return code
        self.child = subprocess.Popen(command, env=env, preexec_fn=own_group_dying_with_parent)
        started = time.monotonic()
        while True:
            try:  # its exit code as soon as it exits: the job's end is not held up
                code = self.child.wait(timeout=0.2)
                # Ended by the signal itself, not by the handlers torchrun puts in as it starts the workers.
                self.before_workers = bool(self.signal) and code == -self.signal
                return 128 + self.signal if self.signal else code
            except subprocess.TimeoutExpired:
                pass
            if failed():
                self.stop_child()
                return 1
            if nodes is not None and not nodes.done:
                nodes.done = nodes.joined(has_children(self.child.pid), time.monotonic())
                if not nodes.done and nodes.overdue(time.monotonic() - started):
                    self.stop_child()
                    raise LaunchError(nodes.give_up())
            if node_zero is not None and not self.signal and node_zero.gone(time.monotonic()):
                self.stop_child()
                raise LaunchError(node_zero.give_up())

    def stop_child(self) -> None:
        assert self.child is not None
        self.child.kill()  # before it restarts anyone; the workers follow (PR_SET_PDEATHSIG)
        self.child.wait()

    def close(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def torchrun(launch: Launch, module: str, arguments: list[str], forwarder: Forwarder,
             failed: Callable[[], bool] = lambda: False) -> int:  # fmt: skip
    """torchrun (our agent.py: the same, quieter) on `module` with `arguments`; its exit code."""
    command = [sys.executable, "-m", f"{PACKAGE}.launch.agent", *launch.torchrun_args, "-m", module, *arguments]
    nodes = NodeWait(launch.values) if "--standalone" not in launch.torchrun_args else None
    node_zero = NodeZeroWatch(launch.values) if nodes is not None and int(launch.values["NODE_RANK"]) != 0 else None
    return forwarder.run(command, {**os.environ, **launch.env}, failed, nodes, node_zero)

"""SIGTERM (what Slurm and Kubernetes send before a kill) becomes a checkpoint and a clean exit.

The ranks must stop after the same step, or the ones that go on would wait forever for the
ones that left. So each rank's flag is max-reduced over a side gloo group, asynchronously:
the reduce started after step k is read after step k+1. No rank ever waits on it, and every
rank sees the same answer at the same step.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType

import torch
import torch.distributed as dist

from .distributed import is_distributed

log = logging.getLogger(__name__)


class Preempted(Exception):
    """Raised after the checkpoint that SIGTERM asked for is on disk."""


class StopOnSigterm:
    """Records SIGTERM and tells all ranks, in agreement, when to stop."""

    def __init__(self) -> None:
        self.received = False
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        self._group = dist.new_group(backend="gloo") if is_distributed() else None
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._pending: dist.Work | None = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received = True

    def should_stop(self) -> bool:
        """Call once per optimizer step on every rank; True on all ranks at the same step."""
        if self._group is None:
            return self.received
        agreed = False
        if self._pending is not None:
            self._pending.wait()
            agreed = bool(self._flag.item())
        if not agreed:
            self._flag.fill_(int(self.received))
            self._pending = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return agreed

    def close(self, wait: bool = True) -> None:
        """Restore the previous handler; with `wait`, first finish the reduce in flight."""
        if wait and self._pending is not None:
            self._pending.wait()
        self._pending = None
        signal.signal(signal.SIGTERM, self._previous)

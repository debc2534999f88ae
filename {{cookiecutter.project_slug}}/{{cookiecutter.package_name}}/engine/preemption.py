"""SIGTERM, SIGINT and SIGHUP become a checkpoint and a clean exit (docs/launching.md). The ranks must stop
after the same step, or the ones that go on would wait forever: each rank's flag is max-reduced over a side
gloo group, asynchronously (the reduce started after step k is read after step k+1), so no rank waits on it.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import cast

import torch
import torch.distributed as dist

from .distributed.process_group import is_distributed

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StopOnSigterm:
    """Records a stop signal and tells all ranks, in agreement, when to stop (and which)."""

    def __init__(self) -> None:
        # The first signal is the one that says why: after Ctrl-C, torchrun's own shutdown may send
        # the workers a SIGTERM too, which must not turn the user's SIGINT into a preemption.
        self.received = 0
        self.agreed = 0  # the signal all ranks agreed on, at the same step
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        self._group = cast(dist.ProcessGroup, dist.new_group(backend="gloo")) if is_distributed() else None  # all ranks
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._pending: dist.Work | None = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received = self.received or signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.agreed or self.received).name

    def should_stop(self) -> bool:
        """Call once per optimizer step on every rank; True on all ranks at the same step."""
        if self._group is None:
            self.agreed = self.received
            return bool(self.received)
        if self._pending is not None:
            self._pending.wait()
            self.agreed = int(self._flag.item())
        if not self.agreed:
            self._flag.fill_(self.received)
            self._pending = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return bool(self.agreed)

    def close(self, wait: bool = True) -> None:
        """Restore the previous handler; with `wait`, first finish the reduce in flight."""
        if wait and self._pending is not None:
            self._pending.wait()
        self._pending = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

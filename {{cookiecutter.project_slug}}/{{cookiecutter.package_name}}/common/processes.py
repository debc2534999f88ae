"""How the job's processes end: with the one that started them (the launcher's torchrun, torchrun's
workers), and at once when their work is done."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from typing import Any, NoReturn


def die_with_parent() -> None:
    """In a child before it runs: the kernel kills it when its parent dies, however it dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def data_worker_start(_worker_id: int) -> None:
    """A DataLoader worker's first step (its worker_init_fn): it dies with its rank, and says nothing
    of the rank's death. A rank stopped mid-batch (the launcher kills the job after an error no restart
    can fix) left its workers alive, and a worker handing it a batch then printed a traceback of the
    broken pipe (multiprocessing's resource_sharer, through sys.excepthook) after the job's one line."""
    die_with_parent()
    rank, said = os.getppid(), sys.excepthook

    def unless_orphaned(*info: Any) -> None:
        time.sleep(0.5)  # a rank that is dying kills this worker meanwhile (PR_SET_PDEATHSIG)
        if os.getppid() == rank:
            said(*info)

    sys.excepthook = unless_orphaned


def own_group_dying_with_parent() -> None:
    """torchrun's setup: a process group of its own, so that Ctrl-C in the terminal reaches it
    once, through the launcher (a second SIGINT during its shutdown would make it SIGTERM the
    workers, which would then stop as if preempted), and death with the launcher."""
    os.setpgid(0, 0)
    die_with_parent()


def exit_now(code: int) -> NoReturn:
    """End a process whose work is done and written (logs flushed, files closed, threads joined by their
    owners), without the interpreter's teardown: torch's takes seconds (docs/speed.md)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # the terminal is gone, or the stream closed
            stream.flush()
    os._exit(code)

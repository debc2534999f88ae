"""How the job's processes end: with the one that started them, whoever that is (the launcher's
torchrun, torchrun's workers), and at once when their work is done. Shared by the launcher and the
workers."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from typing import NoReturn


def die_with_parent() -> None:
    """In a child before it runs: the kernel kills it when its parent dies, however it dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def own_group_dying_with_parent() -> None:
    """torchrun's setup: a process group of its own, so that Ctrl-C in the terminal reaches it
    once, through the launcher (a second SIGINT during its shutdown would make it SIGTERM the
    workers, which would then stop as if preempted), and death with the launcher."""
    os.setpgid(0, 0)
    die_with_parent()


def exit_now(code: int) -> NoReturn:
    """End a process whose work is done and written (logs flushed, files closed, threads joined by
    their owners), without the interpreter's teardown: torch's takes a worker seconds after its last
    line, which every job would pay at its end (docs/speed.md)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # the terminal is gone, or the stream closed
            stream.flush()
    os._exit(code)

"""The errors a user meets, and the one way each is said: a ConfigError (a mistake found before any work) is
one line on stderr and exit code 2 (`fail`); a JobError (an error during training no restart can fix: a
diverged loss, a corrupt data file, nodes launched with other settings) stops the job once, in one line and
its exit code, the traceback in the rank's log file (engine/assembly/entry.py); Preempted is a stop signal
after its checkpoint, 128 + the signal as the exit code."""

from __future__ import annotations

import contextlib
import sys
from typing import NoReturn

from .redaction import redact_text

USER_ERROR_EXIT = 2


class ConfigError(ValueError):
    """A user mistake in the configuration or the launch."""


class JobError(RuntimeError):
    """An error no restart can fix; `exit_code` 2 where it is a mistake in the launch."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Preempted(Exception):
    """The checkpoint a stop signal asked for is on disk."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum  # as a shell reports a process ended by the signal


def first_line(error: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def say(message: str, err: bool = False) -> None:
    """A line on the console, its credentials hidden; none where the terminal is gone (after SIGHUP)."""
    with contextlib.suppress(OSError):
        print(redact_text(message), file=sys.stderr if err else sys.stdout, flush=True)


def fail(message: str) -> NoReturn:
    """A user's mistake: one line on stderr, exit code 2."""
    say(f"error: {message}", err=True)
    sys.exit(USER_ERROR_EXIT)

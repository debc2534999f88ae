"""common/errors.py: the one way each error is said, its exit code, and a console that may be gone."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

import pytest

from {{cookiecutter.package_name}}.common.errors import (
    USER_ERROR_EXIT,
    ConfigError,
    JobError,
    Preempted,
    fail,
    first_line,
    say,
)


def test_a_config_error_is_a_value_error_and_user_mistakes_exit_with_2() -> None:
    assert issubclass(ConfigError, ValueError)
    assert USER_ERROR_EXIT == 2


def test_a_job_error_exits_1_unless_it_is_a_mistake_in_the_launch() -> None:
    assert JobError("loss diverged").exit_code == 1
    launch = JobError("nodes launched with other settings", exit_code=2)
    assert launch.exit_code == 2 and str(launch) == "nodes launched with other settings"
    assert isinstance(launch, RuntimeError)


def test_a_preempted_job_exits_as_a_shell_reports_the_signal() -> None:
    assert Preempted("stopped", signal.SIGTERM).exit_code == 128 + 15
    assert Preempted("stopped", signal.SIGUSR1).exit_code == 128 + signal.SIGUSR1


def test_first_line_is_the_type_and_the_first_line_of_the_message() -> None:
    assert first_line(OSError("  disk full\nthe rest of the story\n")) == "OSError: disk full"
    assert first_line(ConfigError("trainer.epochs must be > 0")) == "ConfigError: trainer.epochs must be > 0"
    assert first_line(KeyboardInterrupt()) == "KeyboardInterrupt", "no message: the type alone"
    assert first_line(ValueError("   ")) == "ValueError"


def test_say_prints_one_line_with_its_credentials_hidden(capsys) -> None:
    say("tracking at http://user:s3cret@host:5000")
    say("to stderr: https://key:hunter2@host/x", err=True)
    out, err = capsys.readouterr()
    assert out == "tracking at http://user:***@host:5000\n"
    assert err == "to stderr: https://key:***@host/x\n"


def test_say_survives_a_console_that_is_gone(monkeypatch) -> None:
    """After SIGHUP (or a reader that went away) a write fails with an OSError: nothing to say it to."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # writes now fail with EPIPE (Python ignores SIGPIPE)
    gone = open(write_end, "w", buffering=1)  # noqa: SIM115
    monkeypatch.setattr(sys, "stdout", gone)
    monkeypatch.setattr(sys, "stderr", gone)
    try:
        say("the run is finished")
        say("a warning", err=True)
    finally:
        monkeypatch.undo()
        with contextlib.suppress(OSError):  # the unwritten line is still buffered: closing fails as well
            gone.close()


def test_fail_says_one_line_on_stderr_and_exits_2(capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        fail("data.root=http://u:pw@host/data: no such folder")
    assert stopped.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "error: data.root=http://u:***@host/data: no such folder\n"

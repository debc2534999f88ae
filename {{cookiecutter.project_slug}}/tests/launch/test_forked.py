"""launch/forked.py: what torchrun's agent asks of a forked worker (pid, poll, wait, signals), and the
forked child's start (its streams, its module's exit code). The whole start against a new interpreter's:
tests/e2e/test_launch.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from {{cookiecutter.package_name}}.launch import forked
from {{cookiecutter.package_name}}.launch.forked import ForkedWorker


def forked_child(body) -> ForkedWorker:
    """A child forked from this process that runs `body` and ends with its exit code (0 if it returns)."""
    pid = os.fork()
    if pid == 0:
        try:
            code = body() or 0
        except BaseException:
            code = 70
        os._exit(code)
    return ForkedWorker(pid)


def test_a_forked_worker_is_polled_waited_and_signalled_as_a_popen_is() -> None:
    child = forked_child(lambda: time.sleep(30))
    assert child.poll() is None and child.returncode is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.1)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=10) == -signal.SIGTERM, "a signal's end as Popen gives it: minus its number"
    child.kill()  # a worker already ended: nothing is sent (its pid may be another process's by now)
    assert child.poll() == -signal.SIGTERM

    exited = forked_child(lambda: 3)
    assert exited.wait(timeout=10) == 3


def test_the_module_runs_as_main_and_its_exit_code_is_the_processes(tmp_path, monkeypatch) -> None:
    (tmp_path / "probe_exit.py").write_text(
        "import sys\nif __name__ == '__main__':\n    sys.exit(int(sys.argv[1]) if sys.argv[1:] else None)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for arguments, code in (([], 0), (["4"], 4)):
        child = forked_child(lambda arguments=arguments: forked.run_module("probe_exit", arguments))
        assert child.wait(timeout=30) == code
    raising = forked_child(lambda: forked.run_module("probe_exit", ["not a number"]))
    assert raising.wait(timeout=30) == 1, "an exception: 1, as a new interpreter's"


def test_the_child_writes_through_new_streams_even_if_a_thread_held_the_agents_at_the_fork(tmp_path) -> None:
    """A log tailer of the agent may hold sys.stdout's lock at the moment of the fork: the child's first print
    would wait forever on the inherited object. fresh_std_streams gives it its own."""
    out = tmp_path / "out.txt"
    held, release = threading.Event(), threading.Event()

    class Holding:  # a stream whose write blocks while the test says so: the lock held across the fork
        encoding, errors = "utf-8", "strict"

        def write(self, text: str) -> int:
            held.set()
            release.wait(30)
            return len(text)

        def flush(self) -> None:
            pass

    saved = sys.stdout
    sys.stdout = Holding()
    writer = threading.Thread(target=print, args=("from a thread",))
    writer.start()
    held.wait(10)
    try:

        def body() -> int:
            fd = os.open(out, os.O_WRONLY | os.O_CREAT)
            os.dup2(fd, 1)
            forked.fresh_std_streams()
            print("the child's line")
            return 0

        child = forked_child(body)
        code = child.wait(timeout=20)
    finally:
        release.set()
        writer.join()
        sys.stdout = saved
    assert code == 0 and out.read_text() == "the child's line\n"

"""Workers forked from torchrun's agent, which has imported torch and the entry module once, each as the new
interpreter it replaces would have been; `WORKER_START=exec` (an environment variable) starts them as torchrun
does, as do commands other than `python -u -m <module>` (docs/speed.md)."""

from __future__ import annotations

import importlib
import io
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
import warnings
from typing import Any

import torch
from torch.distributed.elastic.multiprocessing import api
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler import SubprocessHandler

from ..common.processes import exit_now


class ForkedWorker:
    """What torchrun's agent asks of a worker's Popen (pid, poll, wait), for a forked child."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:  # reaped elsewhere: it is gone
                self.returncode = 1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.02)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkingHandler(SubprocessHandler):
    """torchrun's handler of one worker, which forks `python -u -m <module>` instead of executing it."""

    def _popen(self, args: tuple, env: dict[str, str]) -> Any:
        if os.environ.get("WORKER_START", "fork") == "exec" or list(args[:3]) != [sys.executable, "-u", "-m"]:
            return super()._popen(args, env)
        module, arguments = args[3], list(args[4:])
        try:  # once per agent: every later worker and restart has them
            importlib.import_module(module)
            importlib.import_module("torch._dynamo")  # DDP's and the optimizer's construction import it (1.3 s)
        except SignalException:  # the agent was told to stop meanwhile
            raise
        except Exception:  # noqa: BLE001  # the worker's own start says what is wrong, as torchrun's would
            return super()._popen(args, env)
        if torch.cuda.is_initialized():  # CUDA cannot be used in a forked child of a process that started it
            return super()._popen(args, env)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # nothing of the agent's is written twice
        started, child_started = os.pipe()
        pid = os.fork()
        if pid:
            os.close(child_started)
            os.read(started, 1)  # until the child's session exists (it closes its end): killpg finds it
            os.close(started)
            return ForkedWorker(pid)
        become_worker(env, self._stdout, self._stderr)
        run_module(module, arguments)
        raise AssertionError("unreachable")


def become_worker(env: dict[str, str], stdout: Any, stderr: Any) -> None:
    """In the forked child: what a new process started by Popen would have."""
    try:
        os.setsid()
        for fd, stream in ((1, stdout), (2, stderr)):
            if stream is not None:
                os.dup2(stream.fileno(), fd)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):  # as a new interpreter's
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        fresh_std_streams()
        if (threads := env.get("OMP_NUM_THREADS", "")).isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))  # OpenMP read the agent's environment when torch loaded
    except BaseException:
        traceback.print_exc()
        os._exit(1)


INHERITED: list[Any] = []  # the agent's own stream objects, kept from the collector (see fresh_std_streams)


def fresh_std_streams() -> None:
    """New sys.stdout and sys.stderr on fds 1 and 2, as `python -u` makes them. The agent's objects hold a
    lock that one of its threads (a log tailer) may have held at the fork, and nothing in the child would
    release it: a worker's first print would wait forever. They are kept alive, never closed or flushed."""
    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        INHERITED.append(old)
        stream = io.TextIOWrapper(io.FileIO(1 if name == "stdout" else 2, "w", closefd=False),
                                  encoding=getattr(old, "encoding", None) or "utf-8",
                                  errors=getattr(old, "errors", None) or "strict",
                                  write_through=True)  # fmt: skip
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def run_module(module: str, arguments: list[str]) -> None:
    """`python -m module arguments` in this process, then its exit code as the process's."""
    sys.argv = [module, *arguments]
    try:
        with warnings.catch_warnings():  # runpy's warning that the agent imported the module already
            warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_now(code)


def fork_workers() -> None:
    """torchrun's agent forks its workers (api.py asks get_subprocess_handler for each)."""

    def handler(entrypoint: str, args: tuple, env: dict[str, str], stdout: str, stderr: str,
                local_rank_id: int, numa_options: Any = None) -> SubprocessHandler:  # fmt: skip
        return ForkingHandler(entrypoint, args, env, stdout, stderr, local_rank_id, numa_options)

    api.get_subprocess_handler = handler

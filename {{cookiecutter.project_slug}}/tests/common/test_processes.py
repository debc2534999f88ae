"""common/processes.py: a job's processes end with the one that started them, and at once when done."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
PACKAGE = "{{cookiecutter.package_name}}"


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def gone(pid: int) -> bool:
    """The process no longer runs: reaped, or a zombie that its new parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def wait_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.02)
    return False


def orphan_after_parent_killed(setup: str) -> tuple[int, int, bool]:
    """A parent starts a child that runs `setup` before anything else (as torchrun's workers and the
    launcher's torchrun do), then the parent is SIGKILLed: (the child's pid, its process group, gone)."""
    child = f"""
        import time
        from {PACKAGE}.common.processes import {setup}
        {setup}()
        import os
        print(os.getpid(), os.getpgid(0), flush=True)
        time.sleep(60)
    """
    parent = f"""
        import subprocess, sys, time
        subprocess.Popen({python(child)!r})
        time.sleep(60)
    """
    proc = subprocess.Popen(python(parent), cwd=PROJECT_DIR, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    try:
        pid, group = (int(word) for word in proc.stdout.readline().split())  # the child runs, set up
        proc.kill()
        proc.wait()
        died = wait_gone(pid)
        if not died:
            os.kill(pid, signal.SIGKILL)
        return pid, group, died
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_a_child_dies_when_its_parent_is_killed() -> None:
    pid, _, died = orphan_after_parent_killed("die_with_parent")
    assert died, f"child {pid} outlived its parent"


def test_torchruns_setup_gives_it_a_process_group_of_its_own_and_death_with_the_launcher() -> None:
    pid, group, died = orphan_after_parent_killed("own_group_dying_with_parent")
    assert group == pid, "its own process group: Ctrl-C reaches it once, through the launcher"
    assert died, f"child {pid} outlived its parent"


def test_exit_now_flushes_what_was_printed_and_skips_the_interpreters_teardown() -> None:
    code = f"""
        import atexit, sys
        from {PACKAGE}.common.processes import exit_now
        atexit.register(lambda: print("teardown ran", flush=True))
        print("trained", end="")
        sys.stderr.write("and written")
        exit_now(3)
    """
    buffered = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}  # as under a pipe
    proc = subprocess.run(python(code), cwd=PROJECT_DIR, env=buffered, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "trained", "and written")


def test_a_data_loader_worker_dies_with_its_rank_and_says_nothing_of_its_death(tmp_path) -> None:
    """A rank stopped mid-batch (the launcher kills the job after an error no restart can fix): its
    DataLoader worker, handing it a batch, saw the broken pipe and printed a traceback after the
    job's one line (multiprocessing's resource_sharer, through sys.excepthook)."""
    rank = f"""
        import os, sys, threading, time
        import torch
        from torch.utils.data import DataLoader, Dataset
        from {PACKAGE}.engine.data.loader import loader_options
        from tests.helpers import compose_config, cpu_env
        from {PACKAGE}.config import to_train_config

        class Talking(Dataset):
            def __len__(self):
                return 4

            def __getitem__(self, index):
                if index == 1:  # as resource_sharer's thread: a word once its rank is gone
                    rank = os.getppid()

                    def later():
                        while os.getppid() == rank:
                            time.sleep(0.005)
                        try:
                            raise EOFError
                        except EOFError:
                            sys.excepthook(*sys.exc_info())

                    threading.Thread(target=later, daemon=True).start()
                time.sleep(3 if index else 0)  # busy when its rank goes: past the 2 s it is given to die
                return torch.tensor(os.getpid())

        data = to_train_config(compose_config(["data.num_workers=1", "data.batch_size=1"])).data
        options = dict(loader_options(data, cpu_env(0, 1), 0), collate_fn=None)
        batches = iter(DataLoader(Talking(), **options))
        print(int(next(batches)[0]), flush=True)
        os._exit(0)  # as a rank stopped by the launcher mid-epoch: no DataLoader shutdown
    """
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.run(python(rank), cwd=PROJECT_DIR, stdout=stdout, stderr=stderr, timeout=120)
    assert proc.returncode == 0, err.read_text()
    worker = int(out.read_text())
    died = wait_gone(worker, timeout=2)  # torch's own watchdog would notice after up to 5 s
    if not died:
        os.kill(worker, signal.SIGKILL)
    time.sleep(0.6)  # past the worker's grace: a traceback would be written by now
    assert died, f"the DataLoader worker {worker} outlived its rank"
    assert "EOFError" not in err.read_text(), err.read_text()


def test_a_data_workers_last_words_wait_for_a_dying_rank_to_take_it_first() -> None:
    """What reaches a worker's sys.excepthook is held: a rank that is dying kills the worker meanwhile (the
    test above); a rank alive still hears it."""
    code = f"""
        import sys, time
        from {PACKAGE}.common.processes import data_worker_start
        data_worker_start(0)
        started = time.monotonic()
        try:
            raise EOFError("the pipe to the rank")
        except EOFError:
            sys.excepthook(*sys.exc_info())
        print(round(time.monotonic() - started, 2), flush=True)
    """
    proc = subprocess.run(python(code), cwd=PROJECT_DIR, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "EOFError: the pipe to the rank" in proc.stderr, proc.stderr
    assert float(proc.stdout) >= 0.4, "said at once: a dying rank's worker would print it after the job's line"

"""observe/hangs.py in this process: the stall's one line, the store protocol that names the stalled ranks
(several StallWatch objects, one per rank, on one real store), and DEBUG=1's stack dumps (real
signals, faulthandler's real watchdog). DEBUG=1 reaching the workers: tests/launch/test_plan.py; the whole
path under torchrun: tests/e2e/test_hang.py."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from {{cookiecutter.package_name}}.common.errors import JobError
from {{cookiecutter.package_name}}.observe.hangs import (
    DEBUG_DIR_ENV,
    Beat,
    StallWatch,
    debug_dir,
    rank_list,
    stall_message,
)

# What gloo raises in the ranks that waited (a stalled peer), and in those whose peer died.
GLOO_TIMEOUT = "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation to complete"
GLOO_PEER_GONE = "[gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:18080: Connection reset by peer"


def test_rank_lists_fold_runs() -> None:
    assert rank_list([7, 0, 3, 2, 4]) == "0, 2-4, 7"
    assert rank_list([1]) == "1"


def test_the_stall_line_names_the_stalled_rank_the_step_and_where_the_stacks_are() -> None:
    beats = {1: Beat(step=5, pid=4321, host="node001", count=9)}
    line = stall_message({0: 5, 2: 5, 3: 5}, beats, 4, 10, Path("/runs/a/debug"))
    assert line == (
        "rank 1 did not arrive at step 5 within dist.timeout_s=10 s (ranks 0, 2-3 waited; alive but stuck: "
        "rank 1: in step 5, pid 4321 on node001); every rank's stack: /runs/a/debug/"
    )
    assert "launch with DEBUG=1" in stall_message({0: 5}, beats, 2, 10, None)
    every = stall_message({0: 5, 1: 4}, {}, 2, 10, None)
    assert every.startswith("every rank timed out") and "(rank 0 at step 5, rank 1 at step 4)" in every


@pytest.fixture
def ranks() -> Iterator[list[StallWatch]]:
    """Three ranks' watches on one store, at step 5, their heartbeats fast enough for a short grace."""
    store = dist.HashStore()
    watches = [StallWatch(rank, 3, 10, None, store, beat_s=0.05, grace_s=0.6) for rank in range(3)]
    for watch in watches:
        watch.begin_step(5)
    yield watches
    for watch in watches:
        watch.close()


def raised_in(watch: StallWatch, message: str) -> BaseException:
    """What comes out of the training loop when a collective inside it raised `message`."""
    try:
        with watch.around_training():
            raise RuntimeError(message)
    except BaseException as error:
        return error
    raise AssertionError("around_training swallowed the error")


def test_the_ranks_that_timed_out_name_the_one_that_still_beats_but_never_came(ranks: list[StallWatch]) -> None:
    errors: dict[int, BaseException] = {}
    waiters = [
        threading.Thread(target=lambda r=r: errors.update({r: raised_in(ranks[r], GLOO_TIMEOUT)})) for r in (0, 2)
    ]
    for thread in waiters:
        thread.start()
    for thread in waiters:
        thread.join()
    for rank in (0, 2):
        assert isinstance(errors[rank], JobError), errors[rank]
        assert str(errors[rank]).startswith(
            "rank 1 did not arrive at step 5 within dist.timeout_s=10 s (ranks 0, 2 waited"
        )
        assert isinstance(errors[rank].__cause__, RuntimeError)


def test_a_rank_that_stopped_beating_is_gone_not_stalled_so_torchrun_restarts(ranks: list[StallWatch]) -> None:
    ranks[1].close()  # its heartbeat stops, as a node that vanished without closing its connections
    error = raised_in(ranks[0], GLOO_TIMEOUT)
    assert type(error) is RuntimeError and str(error) == GLOO_TIMEOUT


def test_a_peer_that_died_is_not_a_stall_and_costs_no_wait(ranks: list[StallWatch]) -> None:
    started = time.monotonic()
    error = raised_in(ranks[0], GLOO_PEER_GONE)
    assert type(error) is RuntimeError and str(error) == GLOO_PEER_GONE
    assert time.monotonic() - started < ranks[0].grace_s


def test_a_lost_peer_after_another_rank_timed_out_is_the_same_stall(ranks: list[StallWatch]) -> None:
    timed_out = threading.Thread(target=raised_in, args=(ranks[2], GLOO_TIMEOUT))
    timed_out.start()
    timed_out.join()  # rank 2 named the stall and left; rank 0 then lost its connection to it
    error = raised_in(ranks[0], GLOO_PEER_GONE)
    assert isinstance(error, JobError) and str(error).startswith("rank 1 did not arrive at step 5"), error
    assert "(ranks 0, 2 waited" in str(error)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("DataLoader timed out after 60 seconds"),  # not a peer: this rank's own loader
        RuntimeError("CUDA out of memory"),
        JobError("a corrupt file"),
        ValueError("x"),
    ],
)
def test_errors_that_are_not_about_peers_pass_unchanged(ranks: list[StallWatch], error: Exception) -> None:
    with pytest.raises(type(error)) as raised, ranks[0].around_training():
        raise error
    assert raised.value is error


def read_when(path: Path, condition, timeout: float = 5) -> str:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        if condition(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.02)


def test_kill_usr1_writes_every_thread_stack_into_the_debug_dir(tmp_path: Path) -> None:
    watch = StallWatch(0, 1, 10, tmp_path)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        text = read_when(tmp_path / "stack_rank_0.txt", lambda text: "test_kill_usr1" in text)
    finally:
        watch.close()
    assert "test_kill_usr1_writes_every_thread_stack_into_the_debug_dir" in text, text


@pytest.mark.slow
def test_a_step_that_outlasts_the_timeout_dumps_the_stack_once(tmp_path: Path) -> None:
    watch = StallWatch(0, 1, 1.0, tmp_path)  # 1 s: step 2 must end within it, even on a loaded machine
    try:
        watch.begin_step(1)
        time.sleep(2.0)  # stuck in step 1, past timeout_s: faulthandler's watchdog writes where
        watch.begin_step(2)  # re-armed: step 2 is short
    finally:
        watch.close()  # cancels step 2's dump
    text = read_when(tmp_path / "stack_rank_0.txt", lambda text: "Timeout" in text)
    assert text.count("Timeout (") == 1, text
    assert "test_a_step_that_outlasts_the_timeout_dumps_the_stack_once" in text


def test_the_stacks_go_where_the_launcher_says(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(DEBUG_DIR_ENV, str(tmp_path / "debug"))
    assert debug_dir() == tmp_path / "debug"
    monkeypatch.setenv(DEBUG_DIR_ENV, "")
    assert debug_dir() is None

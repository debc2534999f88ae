"""preemption.py: SIGTERM, SIGINT and SIGHUP become an agreed stop, in this process (a world of one, no
group) and on 2 gloo ranks (one rank signalled or both, both stop after the same step under its name)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from {{cookiecutter.package_name}}.common.errors import Preempted
from {{cookiecutter.package_name}}.engine.preemption import STOP_SIGNALS, StopOnSigterm

from ..helpers import on_ranks


@pytest.fixture
def fallback() -> Iterator[list[int]]:
    """Handlers under StopOnSigterm's that only record: a signal it failed to catch fails the test
    instead of ending pytest. The signals they saw are yielded."""
    seen: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: seen.append(signum)) for sig in STOP_SIGNALS}
    yield seen
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def test_without_a_signal_training_goes_on(fallback: list[int]) -> None:
    stop = StopOnSigterm()
    try:
        assert [stop.should_stop() for _ in range(3)] == [False, False, False]
        assert stop.agreed == 0
    finally:
        stop.close()


@pytest.mark.parametrize(
    ("signals", "name", "exit_code"),
    [
        ([signal.SIGTERM], "SIGTERM", 143),  # 128 + 15: what Slurm requeues on
        ([signal.SIGINT], "SIGINT", 130),  # Ctrl-C
        ([signal.SIGHUP], "SIGHUP", 129),  # a closed terminal, a dropped ssh connection
        ([signal.SIGINT, signal.SIGTERM], "SIGINT", 130),  # Ctrl-C, then torchrun's shutdown: the first says why
    ],
)
def test_a_signal_to_this_process_stops_at_the_next_step_under_its_name(
    fallback: list[int], signals: list[int], name: str, exit_code: int
) -> None:
    stop = StopOnSigterm()
    try:
        assert not stop.should_stop()
        for signum in signals:
            os.kill(os.getpid(), signum)  # Python runs the handler before the next line
        assert stop.should_stop()
        assert stop.agreed == signals[0] and stop.signal_name == name
        assert Preempted(f"stopped by {stop.signal_name}", stop.agreed).exit_code == exit_code
    finally:
        stop.close()
    assert fallback == [], "StopOnSigterm's handler must catch the signal, not the one under it"


def test_close_gives_the_signals_back_to_the_handlers_before_it(fallback: list[int]) -> None:
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    stop = StopOnSigterm()
    assert all(signal.getsignal(sig) is not before[sig] for sig in STOP_SIGNALS)
    stop.close()
    stop.close()  # a second close is harmless: nothing in flight, the same handlers
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before
    os.kill(os.getpid(), signal.SIGTERM)
    assert fallback == [signal.SIGTERM] and stop.received == 0, "after close a signal is no longer its business"


def signalled_on_rank_1(env, everywhere: bool = False) -> tuple[list[bool], int, int, str]:
    """Six steps; rank 1 alone (or, `everywhere`, every rank) gets SIGHUP after the second. What each
    rank's should_stop said; close() (waiting by default) has finished the reduce in flight."""
    stop = StopOnSigterm()
    said = []
    try:
        for step in range(6):
            if step == 2 and (env.rank == 1 or everywhere):
                os.kill(os.getpid(), signal.SIGHUP)
            said.append(stop.should_stop())
    finally:
        stop.close()
    quiet = StopOnSigterm()
    time.sleep(0.5 if env.rank == 1 else 0)  # rank 0's reduce waits for rank 1's, in close()
    quiet.should_stop()  # no signal: a reduce goes in flight
    in_flight = quiet._pending
    quiet.close()
    assert in_flight is not None and in_flight.is_completed(), "close() waits for the reduce in flight"
    return said, stop.received, stop.agreed, stop.signal_name


def test_one_rank_signalled_stops_every_rank_after_the_same_step_under_its_name() -> None:
    (said_0, received_0, agreed_0, name_0), (said_1, received_1, agreed_1, name_1) = on_ranks(2, signalled_on_rank_1)
    # The reduce started at step 2 is read at step 3: both ranks say stop there, and from then on.
    assert said_0 == said_1 == [False, False, False, True, True, True]
    assert (received_0, received_1) == (0, signal.SIGHUP), "rank 0 was never signalled itself"
    assert agreed_0 == agreed_1 == signal.SIGHUP and name_0 == name_1 == "SIGHUP"


def test_a_signal_every_rank_got_is_agreed_under_its_own_name() -> None:
    for said, received, agreed, name in on_ranks(2, signalled_on_rank_1, True):
        assert said == [False, False, False, True, True, True]
        assert received == agreed == signal.SIGHUP and name == "SIGHUP", "the ranks' flags are max-reduced, not summed"

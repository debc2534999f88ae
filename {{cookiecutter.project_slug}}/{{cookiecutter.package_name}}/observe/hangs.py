"""When a rank stalls: one line that names it and the step, and, under DEBUG=1, every rank's stack.

A rank that stops arriving at collectives (stuck in a data loader, in a deadlock, in a branch the
others did not take) leaves the others blocked in their next collective. On gloo that collective
raises after `dist.timeout_s`. Each rank that timed out then says so in the process group's store
and gives the others a few seconds to say the same; the ranks that never say it did not arrive.
They are told apart from dead ones by a heartbeat: every rank's background thread counts up in the
store once a second, with its step, pid and host. A stalled rank's thread still beats (a sleep, a
blocking C call or a busy loop all let it run), a dead node's does not. A stall ends the job once,
with a JobError naming the ranks and the step: a restart would resume to the same stall. A peer
that died closes its connections or stops beating: the error goes on to torchrun, which restarts
the workers as for any crash.

Under DEBUG=1 the launcher sets TRAIN_DEBUG_DIR (`<run dir>/debug`), and every rank also
- re-arms a watchdog at each step (faulthandler's, a C thread: it fires while the rank's Python is
  blocked): a step longer than dist.timeout_s writes all the rank's threads' stacks into
  `stack_rank_<R>.txt`, a few seconds before the ranks that waited give up on it;
- writes them there on `kill -USR1 <pid>`; the ranks that waited send it to stalled ranks on their
  own host, and write where they waited, before they stop the job.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import torch.distributed as dist

from ..common.errors import JobError
from ..common.placement import DistEnv
from ..common.run_dir import DEBUG_DIR_ENV
from ..config import TrainConfig

log = logging.getLogger(__name__)

BEAT_S = 1.0  # how often each rank's heartbeat counts up
GRACE_S = 5.0  # how long a rank that timed out waits for the others to say so too (several beats)
# Looked for only in gloo's messages (they name gloo's source files): a DataLoader's timeout, or a
# network error of the user's code, says "timed out" too, and must not make this rank blame others.
TIMEOUT_WORDS = ("timed out", "timeout")
LOST_PEER_WORDS = ("connection closed", "connection reset", "broken pipe")


def debug_dir() -> Path | None:
    """Where DEBUG=1 puts every rank's stacks; None without DEBUG=1."""
    value = os.environ.get(DEBUG_DIR_ENV, "")
    return Path(value) if value else None


@dataclass(frozen=True)
class Beat:
    """A rank's heartbeat as the store holds it."""

    step: int
    pid: int
    host: str
    count: int


def rank_list(ranks: list[int]) -> str:
    """Ranks as a short list with runs folded: [0, 2, 3, 4, 7] -> "0, 2-4, 7"."""
    parts: list[str] = []
    for rank in sorted(ranks):
        if parts and parts[-1].split("-")[-1] == str(rank - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{rank}"
        else:
            parts.append(str(rank))
    return ", ".join(parts)


def ranks_phrase(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_list(ranks)}"


def stall_message(
    waited: dict[int, int], beats: dict[int, Beat], world_size: int, timeout_s: float, stacks: Path | None
) -> str:
    """The one line of a stall: who did not arrive, at which step, who waited, where the stacks are.
    `waited` maps each rank that timed out to its step; `beats` holds the others' last heartbeats."""
    missing = sorted(set(range(world_size)) - set(waited))
    step = min(waited.values())
    where = (
        f"every rank's stack: {stacks}/" if stacks else "launch with DEBUG=1 for every rank's stack (docs/debugging.md)"
    )
    if not missing:  # all waited, none arrived: they called different collectives
        groups: dict[int, list[int]] = {}
        for rank, at in sorted(waited.items()):
            groups.setdefault(at, []).append(rank)
        steps = ", ".join(
            f"{ranks_phrase(group)} at step {at}" for at, group in sorted(groups.items(), key=lambda g: g[1])
        )
        return (
            f"every rank timed out after dist.timeout_s={timeout_s:g} s in a collective ({steps}): they called "
            f"different ones; code that not every rank runs? {where}"
        )
    shown = "; ".join(f"rank {r}: in step {beats[r].step}, pid {beats[r].pid} on {beats[r].host}" for r in missing[:4])
    more = f"; {len(missing) - 4} more" if len(missing) > 4 else ""
    return (
        f"{ranks_phrase(missing)} did not arrive at step {step} within dist.timeout_s={timeout_s:g} s "
        f"({ranks_phrase(sorted(waited))} waited; alive but stuck: {shown}{more}); {where}"
    )


def is_timeout(error: BaseException) -> bool:
    """A gloo collective that waited dist.timeout_s for a peer."""
    text = str(error).lower()
    return "gloo" in text and any(word in text for word in TIMEOUT_WORDS)


def is_lost_peer(error: BaseException) -> bool:
    """A gloo collective whose peer closed the connection (it died, or left after a stall)."""
    text = str(error).lower()
    return "gloo" in text and any(word in text for word in LOST_PEER_WORDS)


class StallWatch:
    """Tells which ranks stalled when a collective times out (always), and, under DEBUG=1, keeps
    every rank's stacks in the debug dir. A world of one has nothing to wait for: all no-ops."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        timeout_s: float,
        stacks_dir: Path | None = None,
        store: dist.Store | None = None,
        beat_s: float = BEAT_S,
        grace_s: float = GRACE_S,
    ) -> None:
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.beat_s, self.grace_s = beat_s, grace_s
        self.step = 0  # the optimizer step this rank is in (1: the first), as metrics.jsonl counts
        self.stacks_dir = stacks_dir
        self.store = store
        self.heart: threading.Thread | None = None
        self.stopped = threading.Event()
        self.stacks: IO[str] | None = None
        if stacks_dir is not None:
            stacks_dir.mkdir(parents=True, exist_ok=True)
            self.stacks = open(stacks_dir / f"stack_rank_{rank}.txt", "a", encoding="utf-8")  # noqa: SIM115
            faulthandler.register(signal.SIGUSR1, file=self.stacks, all_threads=True)
            log.info(
                "DEBUG: TORCH_DISTRIBUTED_DEBUG=%s; a step over dist.timeout_s=%g s, or kill -USR1 %d, writes this "
                "rank's stacks to %s", dist.get_debug_level().name, timeout_s, os.getpid(), self.stacks.name,
            )  # fmt: skip

    def begin_step(self, number: int) -> None:
        """Call at the start of every optimizer step, with its number."""
        self.step = number
        if self.stacks is not None:  # faulthandler keeps one pending dump: this replaces the last step's
            faulthandler.dump_traceback_later(self.timeout_s, file=self.stacks)
        if self.heart is None and self.world_size > 1 and self.store is not None:
            self.heart = threading.Thread(target=self._beat, name="stall-heartbeat", daemon=True)
            self.heart.start()

    def _beat(self) -> None:
        assert self.store is not None
        host, pid, count = socket.gethostname(), os.getpid(), 0
        while not self.stopped.is_set():
            count += 1
            try:
                self.store.set(f"beat/{self.rank}", json.dumps([self.step, pid, host, count]))
            except Exception:  # the store is gone with the job: nothing left to tell
                return
            self.stopped.wait(self.beat_s)

    @contextlib.contextmanager
    def around_training(self) -> Iterator[None]:
        """Around the training loop: a collective that timed out because ranks stalled becomes a
        JobError that names them; any other error goes on unchanged."""
        try:
            yield
        except RuntimeError as error:
            if isinstance(error, JobError) or self.world_size == 1 or self.store is None:
                raise
            if not (is_timeout(error) or is_lost_peer(error)):
                raise
            stall = self.name_stall(error)
            if stall is None:
                raise
            raise stall from error

    def name_stall(self, error: BaseException) -> JobError | None:
        """The JobError for a stall, or None where no rank stalled (a peer died: torchrun restarts)."""
        assert self.store is not None
        timed_out = is_timeout(error)
        try:
            if timed_out:
                self.store.append("waited", f"{self.rank}:{self.step},")  # type: ignore[attr-defined]  # not in stubs
                before = self.read_beats()
                deadline = time.monotonic() + self.grace_s
                while time.monotonic() < deadline and len(self.read_waited()) < self.world_size:
                    time.sleep(0.1)
            waited, beats = self.read_waited(), self.read_beats()
        except Exception:  # no store to ask: say nothing more than the error itself
            return None
        if not waited:
            return None  # no rank timed out: a peer died
        # A connection lost to a rank that timed out, named the stall and left: this rank waited too.
        waited.setdefault(self.rank, self.step)
        missing = sorted(set(range(self.world_size)) - set(waited))
        if any(rank not in beats for rank in missing):
            return None  # a rank that never beat
        if timed_out and any(rank not in before or beats[rank].count == before[rank].count for rank in missing):
            return None  # a rank that stopped beating is gone (a node lost without a word), not stalled
        self.dump_stacks(error, missing, beats if timed_out else {})  # signal only ranks seen beating
        return JobError(stall_message(waited, beats, self.world_size, self.timeout_s, self.stacks_dir))

    def read_waited(self) -> dict[int, int]:
        assert self.store is not None
        if not self.store.check(["waited"]):
            return {}
        entries = self.store.get("waited").decode().strip(",").split(",")
        return {int(rank): int(step) for rank, step in (entry.split(":") for entry in entries if entry)}

    def read_beats(self) -> dict[int, Beat]:
        assert self.store is not None
        beats = {}
        for rank in range(self.world_size):
            key = f"beat/{rank}"
            if self.store.check([key]):
                beats[rank] = Beat(*json.loads(self.store.get(key)))
        return beats

    def dump_stacks(self, error: BaseException, missing: list[int], alive: dict[int, Beat]) -> None:
        """Under DEBUG=1: where this rank waited, into its stack file; and a SIGUSR1 to the stalled
        ranks on this host that are `alive`, whose own watchdogs have written theirs already."""
        if self.stacks is None:
            return
        self.stacks.write(f"--- rank {self.rank} (pid {os.getpid()}) waited at step {self.step} for "
                          f"{ranks_phrase(missing) if missing else 'no rank'}; it waited here:\n")  # fmt: skip
        self.stacks.write("".join(traceback.format_exception(error)))
        self.stacks.flush()
        here = [alive[rank].pid for rank in missing if rank in alive and alive[rank].host == socket.gethostname()]
        for pid in here:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGUSR1)
        if here:
            time.sleep(0.5)  # their C-level handlers write at once; the launcher kills them when we stop

    def close(self) -> None:
        """Stop the heartbeat, the watchdog and the SIGUSR1 handler."""
        self.stopped.set()
        if self.stacks is not None:
            faulthandler.cancel_dump_traceback_later()
            faulthandler.unregister(signal.SIGUSR1)
            self.stacks.close()
            self.stacks = None


def build_watch(config: TrainConfig, run_dir: Path, env: DistEnv) -> StallWatch:
    """This rank's StallWatch, on the process group's store (a world of one needs none)."""
    store = None
    if env.world_size > 1 and dist.is_initialized():
        # The default group's store reaches every rank (torchrun's agent holds it); a prefix of
        # this restart keeps an earlier restart's keys out of the answer.
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"stalls/{restart}/", dist.distributed_c10d._get_default_store())
    return StallWatch(env.rank, env.world_size, config.dist.timeout_s, debug_dir(), store)

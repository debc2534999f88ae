"""trainer.profile_steps=START:END: torch.profiler traces of exactly those optimizer steps, per rank.

Steps are numbered as metrics.jsonl numbers them (1: the first of the run), across resumes. Each
rank writes `<run dir>/profile/rank_<R>.<ns>.pt.trace.json` (torch.profiler's
tensorboard_trace_handler naming): a Chrome trace that Perfetto (ui.perfetto.dev),
chrome://tracing and TensorBoard's profiler plugin open, with one `ProfilerStep#<N>` span per
step. The step before START runs under the profiler without being recorded (its warm-up: the
profiler's own start-up cost stays out of the trace). Each rank then logs its top operators by
time. On CUDA, trainer.memory_snapshot=true also records the allocator's history over the same
steps into `profile/memory_rank_<R>.pickle`, for pytorch.org/memory_viz.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerAction, ProfilerActivity, profile, tensorboard_trace_handler

from ..common.placement import DistEnv
from ..config import TrainConfig
from ..config.diagnostics import step_range

log = logging.getLogger(__name__)

TOP_OPERATORS = 12
PROFILE_DIR = "profile"  # in the run dir: the traces (and memory snapshots)


class StepProfiler:
    """torch.profiler over optimizer steps first..last; call begin_step(N) at the start of step N (the
    trainer's watches: engine/trainer.py's Watch)."""

    def __init__(self, first: int, last: int, folder: Path, rank: int, device: torch.device,
                 memory_snapshot: bool = False) -> None:  # fmt: skip
        self.first, self.last, self.folder, self.rank, self.device = first, last, folder, rank, device
        self.memory_snapshot = memory_snapshot and device.type == "cuda"
        if memory_snapshot and not self.memory_snapshot:
            log.warning("trainer.memory_snapshot: no CUDA device on this rank, so no memory snapshot")
        self.profiler: profile | None = None
        self.started = 0  # the step the profiler started before: first - 1, or later after a resume
        self.done = False

    def action(self, number: int) -> ProfilerAction:
        """What the profiler does in step `number` (global): the schedule, in the run's own step numbers."""
        if number == self.first - 1:
            return ProfilerAction.WARMUP
        if self.first <= number < self.last:
            return ProfilerAction.RECORD
        return ProfilerAction.RECORD_AND_SAVE if number == self.last else ProfilerAction.NONE

    def around_training(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def begin_step(self, number: int) -> None:
        if self.done:
            return
        if self.profiler is None:
            if number < self.first - 1:
                return
            if number > self.last:  # resumed past the steps to record
                self.done = True
                return
            let_collectives_finish()
            self.start(number)
        elif self.action(number) != self.action(number - 1):
            let_collectives_finish()
        assert self.profiler is not None
        self.profiler.step()  # ends step number-1's span, starts `ProfilerStep#<number>`
        if number > self.last:
            self.close()

    def start(self, number: int) -> None:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self.profiler = profile(
            activities=activities,
            schedule=self.action,
            on_trace_ready=self.save,
            record_shapes=True,
            profile_memory=True,
        )
        # The profiler counts steps from 0; started just before step `number`, its count is the run's.
        self.profiler.step_num = number - 1
        self.profiler.start()
        self.started = number
        if self.memory_snapshot:
            torch.cuda.memory._record_memory_history(max_entries=100_000)

    def save(self, profiler: profile) -> None:
        """The trace, then this rank's top operators; on CUDA the memory snapshot."""
        tensorboard_trace_handler(str(self.folder), worker_name=f"rank_{self.rank}")(profiler)
        sort_by = "self_cuda_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        table = profiler.key_averages().table(sort_by=sort_by, row_limit=TOP_OPERATORS)
        # Recorded: from START (or the first step after a resume) to END (or the run's last step).
        first, last = max(self.first, self.started), min(self.last, profiler.step_num)
        log.info("profile of steps %d-%d in %s/; top operators by time:\n%s", first, last, self.folder, table)
        if self.memory_snapshot:
            torch.cuda.memory._dump_snapshot(str(self.folder / f"memory_rank_{self.rank}.pickle"))
            torch.cuda.memory._record_memory_history(enabled=None)

    def close(self) -> None:
        """Stop the profiler: a trace of the steps recorded so far is written if it was not yet."""
        if self.profiler is not None:
            self.profiler.stop()
            self.profiler = None
        self.done = True


def let_collectives_finish() -> None:
    """Call before the profiler starts or stops recording. A collective that begins under the
    profiler and ends, on gloo's thread, after it stopped, ends its record in freed memory: the
    rank crashes or hangs (torch 2.14, measured). The agreement on SIGTERM (preemption.py) is such a
    collective, always in flight between steps: the barrier makes sure every rank has started it,
    so that it can complete, and the pause lets gloo's thread finish it."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        time.sleep(0.1)


def build_watch(config: TrainConfig, run_dir: Path, env: DistEnv) -> StepProfiler | None:
    """The profiler trainer.profile_steps asks for; None without it (the loop's calls then cost nothing)."""
    trainer: Any = config.trainer  # its fields from config/diagnostics.py's SECTION_FIELDS
    steps = step_range("trainer.profile_steps", trainer.profile_steps)
    if steps is None:
        return None
    return StepProfiler(*steps, run_dir / PROFILE_DIR, env.rank, env.device, trainer.memory_snapshot)

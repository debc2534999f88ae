"""The training loop: epochs of optimizer steps, evaluation, checkpoints; it stops on agreed signals.

Everything it uses is built by build.py and owned elsewhere: the strategy (strategies/) spreads the
model over the ranks, the checkpoint manager (checkpoint/manager.py) saves and resumes, the runner
(step.py) runs one optimizer step, the sinks (observe/) receive what metrics.jsonl receives.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch

from ..config import TrainConfig
from ..errors import JobError, Preempted
from ..observe.hangs import StallWatch
from ..observe.logs import MetricsLog, use_progress_bar
from ..observe.profiling import Profiler
from ..placement import DistEnv
from ..run_dir import FINISHED_MARKER, STOPPED_MARKER, write_marker
from .checkpoint.manager import CheckpointManager
from .data import Data
from .distributed import all_reduce_sum, weights_fingerprint
from .evaluate import EvalResult, evaluate
from .optim import lr_at, set_lr
from .preemption import StopOnSigterm
from .sampler import ResumableDistributedSampler
from .step import StepRunner
from .strategies import Strategy

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Where training stands: enough, with model and optimizer, to continue bit-exactly."""

    epoch: int = 0
    step: int = 0  # global optimizer steps taken
    samples_in_epoch: int = 0  # samples of `epoch`'s order already trained on, over all ranks

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        self.epoch, self.step, self.samples_in_epoch = payload["epoch"], payload["step"], payload["samples_in_epoch"]


@dataclass
class Interval:
    """Loss and sample counts since the last log line, kept on the device: no sync per step."""

    loss_sum: torch.Tensor
    steps: int = 0
    samples: int = 0
    started: float = field(default_factory=time.perf_counter)

    def reset(self) -> None:
        self.loss_sum.zero_()
        self.steps, self.samples, self.started = 0, 0, time.perf_counter()


@dataclass
class OptimizerStep:
    """One optimizer step: its micro-batches (read once, in order) and its real sample count."""

    micro_batches: Iterator[Any]  # (inputs, targets, weights, indices) from the loader
    count: int  # micro-batches in the step: grad_accum_steps, fewer at the epoch's end
    real_samples: int  # non-padding samples in the step's global batch, over all ranks


def optimizer_steps(
    batches: Iterable[Any], sampler: ResumableDistributedSampler, accum: int
) -> Iterator[OptimizerStep]:
    """The rest of the epoch's micro-batches, grouped into optimizer steps of `accum` each."""
    batches, left, samples_done = iter(batches), sampler.steps_left(), sampler.start
    while left > 0:
        count = min(accum, left)
        real_samples = sampler.real_samples_in_step(samples_done, count)
        yield OptimizerStep(itertools.islice(batches, count), count, real_samples)
        left, samples_done = left - count, samples_done + real_samples


@dataclass
class Trainer:
    config: TrainConfig
    env: DistEnv
    run_dir: Path
    strategy: Strategy  # how the model is spread over the ranks (strategies/)
    model: torch.nn.Module  # the user's model as the strategy holds it (runner.trained is what trains)
    optimizer: torch.optim.Optimizer
    data: Data
    task: Any  # the loss and the metrics (tasks.py)
    runner: StepRunner  # forward, backward and the optimizer step
    checkpoints: CheckpointManager
    metrics: MetricsLog
    sample_audit: MetricsLog  # logs/samples_rank_<R>.jsonl, when trainer.record_samples is on
    stalls: StallWatch  # a rank that stalls is named; DEBUG=1 keeps every rank's stacks (hangs.py)
    profiler: Profiler  # trainer.profile_steps (profiling.py); a no-op without it
    state: TrainState = field(default_factory=TrainState)

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint holds (a collective: every rank calls it at the same point)."""
        return self.checkpoints.state_dict()

    def load_state_dict(self, payload: dict[str, Any], source: Path | str = "checkpoint") -> None:
        """The exact inverse of state_dict(), at this world size."""
        self.checkpoints.load_state_dict(payload, source)

    def save(self) -> float | None:
        """Checkpoint the current step; how long training was held (ms), None where nothing was written."""
        return self.checkpoints.save(self.state.step)

    def log_interval(self, interval: Interval, progress_bar: Any = None) -> None:
        loss_sum = all_reduce_sum(interval.loss_sum.clone())
        elapsed = time.perf_counter() - interval.started
        train_loss = loss_sum.item() / (self.env.world_size * interval.steps)
        if not math.isfinite(train_loss):  # the same sum on every rank: all stop at this step
            raise JobError(
                f"training diverged by step {self.state.step}: the loss is {train_loss}; lower optim.lr or set "
                f"trainer.clip_grad_norm, then resume from the last checkpoint (it holds finite weights)"
            )
        values = {
            "step": self.state.step,
            "epoch": self.state.epoch,
            "train_loss": train_loss,
            "lr": self.optimizer.param_groups[0]["lr"],
            "samples_per_s": interval.samples / max(elapsed, 1e-9),
        }
        self.metrics.write("train", **values)
        log.info(
            "epoch %d step %d: train_loss=%.4f lr=%.4g %.0f samples/s",
            values["epoch"],
            values["step"],
            train_loss,
            values["lr"],
            values["samples_per_s"],
        )
        if progress_bar is not None:
            progress_bar.set_postfix(
                step=values["step"], loss=f"{train_loss:.4f}", img_per_s=f"{values['samples_per_s']:.0f}"
            )
        interval.reset()

    def train_step(self, step: OptimizerStep, interval: Interval) -> None:
        """One optimizer step over its micro-batches; gradients all-reduced once, with the last."""
        config, state = self.config, self.state
        self.stalls.begin_step(state.step + 1)
        self.profiler.step(state.step + 1)
        progress = state.epoch + (state.samples_in_epoch + step.real_samples) / self.data.sampler.dataset_size
        set_lr(self.optimizer, lr_at(config.optim, progress, config.trainer.epochs))
        for number, (inputs, targets, weights, indices) in enumerate(step.micro_batches, 1):
            sync = number == step.count
            interval.loss_sum += self.runner.micro_step(inputs, targets, weights, step.real_samples, sync=sync)
            if self.sample_audit.enabled:
                indices = indices[weights.cpu() > 0].tolist()
                self.sample_audit.write("samples", step=state.step + 1, epoch=state.epoch, indices=indices)
        self.runner.optimizer_step()
        self.checkpoints.raise_if_failed()  # a background write that failed stops the run here
        state.step += 1
        state.samples_in_epoch += step.real_samples
        interval.steps += 1
        interval.samples += step.real_samples

    def train_epoch(self, stop: StopOnSigterm) -> None:
        """Train the rest of the current epoch (from where a resume left it)."""
        config, state, sampler = self.config, self.state, self.data.sampler
        sampler.set_epoch(state.epoch)  # a new order every epoch: the classic forgotten call
        sampler.set_start(state.samples_in_epoch)  # mid-epoch after a resume
        interval = Interval(torch.zeros((), device=self.env.device))
        batches: Any = self.data.train_loader
        bar = None
        if use_progress_bar(self.env):
            from tqdm import tqdm

            batches = bar = tqdm(batches, total=sampler.steps_left(), desc=f"epoch {state.epoch}", leave=False)
        for step in optimizer_steps(batches, sampler, config.trainer.grad_accum_steps):
            self.train_step(step, interval)
            if state.step % config.trainer.log_every_n_steps == 0:
                self.log_interval(interval, bar)
            if self.checkpoints.due(state.step, epoch_done=state.samples_in_epoch >= sampler.dataset_size):
                self.save()
            if stop.should_stop():
                self.stop(stop)
        if interval.steps:
            self.log_interval(interval, bar)

    def end_epoch(self) -> None:
        """Move on to the next epoch (its order starts from the beginning)."""
        self.state.epoch, self.state.samples_in_epoch = self.state.epoch + 1, 0

    def stop(self, stop: StopOnSigterm) -> NoReturn:
        """A signal every rank agreed on: checkpoint this step, wait for the write, stop."""
        self.save()
        self.checkpoints.wait()
        signum = stop.agreed
        if self.env.is_main:  # the launcher reads it: torchrun's own exit code does not say
            write_marker(self.run_dir, STOPPED_MARKER, f"{signum}\n")
        raise Preempted(f"stopped by {stop.signal_name} after step {self.state.step}; checkpoint saved", signum)

    def validate(self) -> EvalResult:
        self.strategy.sync_buffers()  # rank 0's buffers (BatchNorm statistics) on every rank
        lockstep = self.strategy.lockstep_evaluation
        return evaluate(self.model, self.data.val_loader, self.task, self.env.device, lockstep=lockstep)

    def fit(self) -> EvalResult:
        """Train the remaining epochs and return the last evaluation."""
        stop = StopOnSigterm()
        try:
            with self.stalls.naming_stalls():  # a collective that timed out names the ranks that stalled
                result = self.train_epochs(stop)
            self.checkpoints.wait()
            if self.env.is_main:  # before the signal handlers go: a stop signal from here on changes nothing
                write_marker(self.run_dir, FINISHED_MARKER, f"{self.state.step}\n")
        except BaseException:
            stop.close(wait=False)  # a peer may be gone: waiting for it could hang
            raise
        else:
            stop.close()
        finally:
            self.checkpoints.wait()  # the end of the job waits for the last write
            self.metrics.close()
            self.profiler.close()
            self.stalls.close()
        if result is None:
            log.info("training had already finished at step %d; evaluating", self.state.step)
            result = self.validate()
        # After validate() every rank holds rank 0's buffers. Where each rank holds the whole weights it
        # logs their fingerprint (the same on every rank); where they are gathered, rank 0 does.
        if weights := self.strategy.full_weights():
            log.info("weights at step %d: sha256 %s", self.state.step, weights_fingerprint(weights))
        if self.config.trainer.compile:  # that trainer.compile took effect, and how well
            from torch._dynamo.utils import counters

            log.info("torch.compile: %d graphs compiled, %d graph breaks", counters["stats"]["unique_graphs"],
                     sum(counters["graph_break"].values()))  # fmt: skip
        return result

    def train_epochs(self, stop: StopOnSigterm) -> EvalResult | None:
        config, state = self.config, self.state
        result = None
        while state.epoch < config.trainer.epochs:
            started, start_samples = time.perf_counter(), state.samples_in_epoch
            self.train_epoch(stop)
            elapsed = time.perf_counter() - started
            result = self.validate()
            self.metrics.write("val", step=state.step, epoch=state.epoch, **result.record())
            log.info(
                "epoch %d/%d done in %.1f s (%.0f samples/s): %s",
                state.epoch + 1,
                config.trainer.epochs,
                elapsed,
                (state.samples_in_epoch - start_samples) / max(elapsed, 1e-9),
                result.line(),
            )
            self.end_epoch()
            self.save()
        return result

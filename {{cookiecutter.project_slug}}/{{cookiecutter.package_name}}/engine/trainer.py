"""The training loop: epochs of optimizer steps (or trainer.max_steps of them), validation, checkpoints;
it stops on agreed signals, and early when the monitored figure stops improving.

Everything it uses is built by build.py and owned elsewhere: the strategy (strategies/) spreads the
model over the ranks, the checkpoint manager (checkpoint/manager.py) saves and resumes, the runner
(step.py) runs one optimizer step, the schedule (schedule.py) sets its learning rate, the monitor
(monitor.py) ranks validations, the EMA (ema.py) averages the weights, the sinks (observe/) receive
what metrics.jsonl receives.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch

from ..config import TrainConfig
from ..errors import JobError, Preempted
from ..observe.figures import Throughput
from ..observe.hangs import StallWatch
from ..observe.logs import MetricsLog, use_progress_bar
from ..observe.profiling import Profiler
from ..placement import DistEnv
from ..run_dir import FINISHED_MARKER, STOPPED_MARKER, write_marker
from .callbacks import Callbacks
from .checkpoint.manager import CheckpointManager
from .compatibility import run_finished
from .data import Data
from .distributed import all_reduce_sum, weights_fingerprint
from .ema import EMA, NoEMA
from .evaluate import EvalResult, evaluate
from .monitor import Monitor
from .preemption import StopOnSigterm
from .progress import Interval, OptimizerStep, TrainState, optimizer_steps
from .schedule import Schedule
from .step import StepRunner
from .strategies import Strategy

log = logging.getLogger(__name__)


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
    schedule: Schedule  # the learning rate of each step (schedule.py)
    monitor: Monitor  # checkpoint.monitor: best checkpoints, early stopping (monitor.py)
    ema: EMA | NoEMA  # trainer.ema (ema.py): the average validation uses
    callbacks: Callbacks = field(default_factory=lambda: Callbacks({}))  # the config's callbacks (callbacks.py)
    throughput: Throughput = field(default_factory=Throughput)  # tokens/s, peak memory, MFU (observe/figures.py)
    state: TrainState = field(default_factory=TrainState)
    validated_at: int = -1  # the step of the last validation in this process (none twice at a step)
    last_result: EvalResult | None = None  # that validation's figures
    grad_norms: torch.Tensor | None = None  # the sum of the interval's gradient norms, on the device

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint holds (a collective: every rank calls it at the same point)."""
        return self.checkpoints.state_dict()

    def load_state_dict(self, payload: dict[str, Any], source: Path | str) -> None:
        """The exact inverse of state_dict(), at this world size."""
        self.checkpoints.load_state_dict(payload, source)

    def save(self) -> float | None:
        """Checkpoint the current step; how long training was held (ms), None where nothing was written."""
        return self.checkpoints.save(self.state.step)

    def log_interval(self, interval: Interval, progress_bar: Any = None) -> None:
        # One all-reduce and one read-back per log line: the loss summed over the ranks, the gradient
        # norm (the same on every rank) with it, on the loss's device (fsdp.cpu_offload's is the CPU).
        grad_norms = self.grad_norms if self.grad_norms is not None else torch.zeros_like(interval.loss_sum)
        sums = all_reduce_sum(torch.stack([interval.loss_sum, grad_norms.to(interval.loss_sum)])).tolist()
        elapsed = time.perf_counter() - interval.started
        train_loss = sums[0] / (self.env.world_size * interval.steps)
        if not math.isfinite(train_loss):  # the same sum on every rank: all stop at this step
            raise JobError(
                f"training diverged by step {self.state.step}: the loss is {train_loss}; lower optim.lr or set "
                f"trainer.clip_grad_norm, then resume from the last checkpoint (it holds finite weights)"
            )
        values = {
            "step": self.state.step,
            "epoch": self.state.epoch,
            "train_loss": train_loss,
            "lr": interval.lr,
            "samples_per_s": interval.samples / max(elapsed, 1e-9),
            "grad_norm": sums[1] / (self.env.world_size * interval.steps),  # before clipping; the interval's mean
            **self.throughput.figures(interval.samples / max(elapsed, 1e-9), self.env),
        }
        self.metrics.write("train", **values)
        log.info("epoch %d step %d: train_loss=%.4f lr=%.4g grad_norm=%.4g %.0f samples/s", values["epoch"],
                 values["step"], train_loss, values["lr"], values["grad_norm"], values["samples_per_s"])  # fmt: skip
        if progress_bar is not None:
            progress_bar.set_postfix(
                step=values["step"], loss=f"{train_loss:.4f}", img_per_s=f"{values['samples_per_s']:.0f}"
            )
        interval.reset()
        if self.grad_norms is not None:
            self.grad_norms.zero_()

    def train_step(self, step: OptimizerStep, interval: Interval) -> None:
        """One optimizer step over its micro-batches; gradients all-reduced once, with the last."""
        state = self.state
        self.stalls.begin_step(state.step + 1)
        self.profiler.step(state.step + 1)
        if self.schedule.length.by_steps:
            self.schedule.before_step(state.step + 1)
        else:  # in epochs, counted in samples: the same curve at any world size
            epochs_done = (state.samples_in_epoch + step.real_samples) / self.data.sampler.dataset_size
            self.schedule.before_step(state.epoch + epochs_done)
        if self.callbacks.step_start:
            self.callbacks.fire("on_step_start")
        interval.lr = self.optimizer.param_groups[0]["lr"]
        for number, (inputs, targets, weights, indices) in enumerate(step.micro_batches, 1):
            sync = number == step.count
            if self.throughput.tokens_per_sample is None:  # once: the language model's sequence length
                self.throughput.count_tokens(self.task, targets, self.model)
            interval.loss_sum += self.runner.micro_step(inputs, targets, weights, step.real_samples, sync=sync)
            if self.sample_audit.enabled:
                indices = indices[weights.cpu() > 0].tolist()
                self.sample_audit.write("samples", step=state.step + 1, epoch=state.epoch, indices=indices)
        grad_norm = self.runner.optimizer_step()
        if self.grad_norms is None:
            self.grad_norms = torch.zeros((), device=grad_norm.device)
        self.grad_norms += grad_norm
        self.schedule.after_step()
        self.ema.update(state.step + 1)
        self.checkpoints.raise_if_failed()  # a background write that failed stops the run here
        state.step += 1
        state.samples_in_epoch += step.real_samples
        interval.steps += 1
        interval.samples += step.real_samples
        if self.callbacks.step_end:
            self.callbacks.fire("on_step_end")

    def train_epoch(self, stop: StopOnSigterm) -> None:
        """Train the rest of the current epoch (from where a resume left it), or up to trainer.max_steps,
        validating every trainer.val_every_n_steps; it ends early where the monitor stops the run."""
        config, state, sampler = self.config, self.state, self.data.sampler
        sampler.set_epoch(state.epoch)  # a new order every epoch: the classic forgotten call
        sampler.set_start(state.samples_in_epoch)  # mid-epoch after a resume
        interval = Interval(torch.zeros((), device=self.env.device))
        batches: Any = self.data.train_loader
        bar = None
        if use_progress_bar(self.env):
            from tqdm import tqdm

            batches = bar = tqdm(batches, total=sampler.steps_left(), desc=f"epoch {state.epoch}", leave=False)
        max_steps, val_every = config.trainer.max_steps, config.trainer.val_every_n_steps
        for step in optimizer_steps(batches, sampler, config.trainer.grad_accum_steps):
            self.train_step(step, interval)
            if state.step % config.trainer.log_every_n_steps == 0:
                self.log_interval(interval, bar)
            epoch_done = state.samples_in_epoch >= sampler.dataset_size
            if val_every and state.step % val_every == 0 and not epoch_done:  # an epoch's end validates anyway
                self.validation()
            if self.checkpoints.due(state.step, epoch_done=epoch_done):
                self.save()
            if self.monitor.stopped or state.step == max_steps:  # the same step on every rank
                break  # (a stop signal now changes nothing: the run saves and ends)
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

    def validate(self, loader: Any = None) -> EvalResult:
        self.strategy.sync_buffers()  # rank 0's buffers (BatchNorm statistics) on every rank
        lockstep = self.strategy.lockstep_evaluation
        loader = self.data.val_loader if loader is None else loader
        with self.ema.swapped_in():  # trainer.ema: the average is what is validated
            return evaluate(self.model, loader, self.task, self.env.device, lockstep=lockstep)

    def evaluate_on(self, loader: Any) -> dict[str, float]:
        """The task's metrics over another data set's loader, as the validation evaluates (run.evaluate)."""
        return self.validate(loader).metrics

    def validation(self, epoch_end: bool = False) -> EvalResult:
        """Validate at this step, record it, and let the monitor rank it: a checkpoint of this step
        where it is one of the best (at an epoch's end, of the next epoch's start: the end saves it)."""
        state = self.state
        started = time.perf_counter()
        result = self.last_result = self.validate()
        self.validated_at = state.step
        record = result.record()
        self.metrics.write("val", step=state.step, epoch=state.epoch, **record)
        self.callbacks.fire("on_validation_end", record)
        if not epoch_end:
            log.info("step %d: %s (validated in %.1f s)", state.step, result.line(), time.perf_counter() - started)
        if epoch_end:
            self.end_epoch()
        if self.schedule.needs_metric:  # ReduceLROnPlateau: before the checkpoints below, which hold its state
            self.schedule.after_validation(float(record[self.monitor.key]))
        if self.monitor.observe(state.step, record):
            self.checkpoints.keep_best(self.monitor.kept_steps())
            self.save()
        if self.monitor.stopped:
            self.save()
            log.info("stopping early at step %d: %s", state.step, self.monitor.stopped)
        return result

    def finished(self) -> bool:
        """Whether the run has trained all it will (run_finished, of this state)."""
        trainer = self.config.trainer
        return run_finished(self.state.state_dict() | self.monitor.state_dict(), trainer.epochs, trainer.max_steps)

    def fit(self) -> EvalResult:
        """Train the remaining epochs and return the last evaluation."""
        if self.env.is_main and not self.finished() and (warning := self.schedule.warmup_outlasts_run()):
            log.warning(warning)
        stop = StopOnSigterm()
        try:
            with self.stalls.naming_stalls():  # a collective that timed out names the ranks that stalled
                self.callbacks.fire("on_train_start")
                result = self.train_epochs(stop)
                self.checkpoints.wait()
                self.callbacks.fire("on_train_end")
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
            why = f" (stopped early: {self.monitor.stopped})" if self.monitor.stopped else ""
            log.info("training had already finished at step %d%s; evaluating", self.state.step, why)
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
        while not self.finished():
            started, start_samples = time.perf_counter(), state.samples_in_epoch
            self.train_epoch(stop)
            elapsed = time.perf_counter() - started
            if state.samples_in_epoch < self.data.sampler.dataset_size:  # max_steps reached, or stopped early
                result = self.last_result if self.validated_at == state.step else self.validation()
                self.save()
                break
            result = self.validation(epoch_end=True)
            log.info(
                "epoch %d%s done in %.1f s (%.0f samples/s): %s",
                state.epoch,  # the next one's number now: the one done, counted from 1
                "" if config.trainer.max_steps else f"/{config.trainer.epochs}",
                elapsed,
                (self.data.sampler.dataset_size - start_samples) / max(elapsed, 1e-9),
                result.line(),
            )
            self.save()
        return result

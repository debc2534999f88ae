"""The training loop and its step, in the order they run: read it top to bottom.

    Trainer.fit                 train_start callbacks, the epochs, the last checkpoint, train_end
      Trainer.train_epochs      epoch after epoch until trainer.epochs or trainer.max_steps
        Trainer.train_epoch     the epoch's optimizer steps; log lines, validation, checkpoints, stop signals
          Trainer.train_step    the learning rate, step callbacks, the micro-batches, the optimizer step
            StepRunner.micro_step      forward, loss, backward (gradients reduced with the last one only)
            StepRunner.optimizer_step  clip, step, zero the gradients
        Trainer.end_epoch       the next epoch starts from its beginning
      Trainer.validation        evaluate and record; Trainer.judge: the scheduler and the monitor see it
    Interval, optimizer_steps: the figures since the last log line; the micro-batches grouped into steps

What the loop uses is built by assembly/build.py (docs/layout.md); where training stands is state.py. Nothing
in a step reads a value back to the host: the loss stays on the device until the log line (docs/speed.md).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn, Protocol

import torch
from torch import nn

from ..common.errors import JobError, Preempted
from ..common.placement import DistEnv
from ..common.registry import modules_with
from ..common.run_dir import FINISHED_MARKER, STOPPED_MARKER, write_marker
from ..config import TrainConfig, TrainerConfig
from ..config.compatibility import run_finished
from ..datasets.collate import Batch, model_forward, to_device
from ..observe.figures import Throughput
from ..observe.logs import MetricsLog, use_progress_bar
from ..tasks import Task, sample_weights
from .callbacks import Callbacks
from .checkpoint.files import with_owner_tensors
from .checkpoint.manager import CheckpointManager, agree_on_checkpoint
from .data.loader import Data
from .data.sampler import ResumableDistributedSampler
from .distributed.dtensors import is_sharded
from .distributed.process_group import all_reduce_sum, weights_fingerprint
from .ema import EMA, NoEMA
from .evaluate import EvalResult, evaluate
from .monitor import Monitor
from .preemption import StopOnSigterm
from .schedule import Schedule
from .state import TrainState
from .strategies import Strategy

log = logging.getLogger(__name__)

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Watch(Protocol):
    """A diagnostic around the loop, built by an observe/ module's `build_watch(config, run_dir, env)`."""

    def around_training(self) -> AbstractContextManager[None]: ...  # the epochs, the last checkpoint, the test
    def begin_step(self, number: int) -> None: ...  # at the start of optimizer step `number` (1: the first)
    def close(self) -> None: ...  # when the loop ends, however it ends


@dataclass
class Trainer:
    config: TrainConfig
    env: DistEnv
    run_dir: Path
    strategy: Strategy  # how the model is spread over the ranks (strategies/)
    model: nn.Module  # the user's model as the strategy holds it (runner.trained is what trains)
    optimizer: torch.optim.Optimizer
    data: Data
    task: Task  # the loss and the metrics (tasks/__init__.py)
    runner: StepRunner  # forward, backward and the optimizer step (below)
    checkpoints: CheckpointManager
    metrics: MetricsLog
    sample_audit: MetricsLog  # logs/samples_rank_<R>.jsonl, when trainer.record_samples is on
    watches: tuple[Watch, ...]  # diagnostics around the loop (Watch, below)
    schedule: Schedule  # the learning rate of each step (schedule.py)
    monitor: Monitor  # checkpoint.monitor: best checkpoints, early stopping (monitor.py)
    ema: EMA | NoEMA  # trainer.ema (ema.py): the average validation uses
    callbacks: Callbacks = field(default_factory=lambda: Callbacks({}))  # the config's callbacks (callbacks.py)
    throughput: Throughput = field(default_factory=Throughput)  # tokens/s, peak memory, MFU (observe/figures.py)
    state: TrainState = field(default_factory=lambda: TrainState())
    validated_at: int = -1  # the step of the last validation in this process (none twice at a step)
    last_result: EvalResult | None = None  # that validation's figures
    grad_norms: torch.Tensor | None = None  # the sum of the interval's gradient norms, on the device
    divergence: Any = None  # a divergence watch, where the project has one (divergence_module; __post_init__)

    def __post_init__(self) -> None:
        trainer, found = self.config.trainer, divergence_module()
        if found is not None:
            self.divergence = found.divergence_watch(self.env.device, trainer.log_every_n_steps, trainer.precision)
        if self.divergence is not None and self.divergence.grads_watched:
            self.runner.before_clipping = self.divergence.note_gradients

    def diverged(self, loss_sum: float, grad_norms: float) -> bool:
        """Whether the log line's sums (every rank's alike) say that a step went non-finite. Under fp16 the loss
        alone: its GradScaler skips a step with non-finite gradients as a matter of course."""
        gradient = self.config.trainer.precision != "fp16" and not math.isfinite(grad_norms)
        return not math.isfinite(loss_sum) or gradient

    def fit(self) -> EvalResult:
        """Train the remaining epochs and return the last evaluation."""
        if self.env.is_main and not self.finished() and (warning := self.schedule.warmup_outlasts_run()):
            log.warning(warning)
        stop = StopOnSigterm()
        try:
            with contextlib.ExitStack() as around:
                for watch in self.watches:
                    around.enter_context(watch.around_training())
                self.callbacks.fire("on_train_start")
                result = self.train_epochs(stop)
                self.checkpoints.wait()
                self.callbacks.fire("on_train_end")
                held = self.test() if result is not None and self.data.test_loader is not None else self.state.step
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
            for watch in reversed(self.watches):
                watch.close()
        if result is None:
            why = f" (stopped early: {self.monitor.stopped})" if self.monitor.stopped else ""
            log.info("training had already finished at step %d%s; evaluating", self.state.step, why)
            result = self.validate_all()
        # After validate() every rank holds rank 0's buffers. Where each rank holds the whole weights it
        # logs their fingerprint (the same on every rank); where they are gathered, rank 0 does.
        if weights := self.strategy.full_weights():
            log.info("weights at step %d: sha256 %s", held, weights_fingerprint(weights))
        if self.config.trainer.compile:  # that trainer.compile took effect, and how well
            from torch._dynamo.utils import counters

            log.info("torch.compile: %d graphs compiled, %d graph breaks", counters["stats"]["unique_graphs"],
                     sum(counters["graph_break"].values()))  # fmt: skip
        return result

    def train_epochs(self, stop: StopOnSigterm) -> EvalResult | None:
        """Epochs until the run has trained all it will; the last validation's figures (None: nothing left)."""
        config, state = self.config, self.state
        result = None
        while not self.finished():
            started, start_samples = time.perf_counter(), state.samples_in_epoch
            self.train_epoch(stop)
            elapsed = time.perf_counter() - started
            if state.samples_in_epoch < self.data.sampler.dataset_size:  # max_steps reached, or stopped early
                result = self.last_result if self.validated_at == state.step else self.judge(self.validation())
                self.save()
                break
            result = self.validation()
            log.info(
                "epoch %d%s done in %.1f s (%.0f samples/s): %s",
                state.epoch + 1,  # counted from 1
                "" if config.trainer.max_steps else f"/{config.trainer.epochs}",
                elapsed,
                (self.data.sampler.dataset_size - start_samples) / max(elapsed, 1e-9),
                result.line(),
            )
            self.end_epoch()  # before the monitor's checkpoint: a best one at an epoch's end resumes at the next
            self.judge(result)
            self.save()
        return result

    def train_epoch(self, stop: StopOnSigterm) -> None:
        """Train the rest of the current epoch or up to trainer.max_steps, validating every val_every_n_steps."""
        config, state, sampler = self.config, self.state, self.data.sampler
        sampler.set_epoch(state.epoch)  # a new order every epoch: the classic forgotten call
        sampler.set_start(state.samples_in_epoch)  # mid-epoch after a resume
        loss_sum, items, empty = (torch.zeros((), device=self.env.device) for _ in range(3))
        interval = Interval(loss_sum, items, empty)
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
                self.raise_if_diverged(interval)
                started = time.perf_counter()
                result = self.validation()
                log.info("step %d: %s (validated in %.1f s)", state.step, result.line(), time.perf_counter() - started)
                self.judge(result)
            if self.checkpoints.due(state.step, epoch_done=epoch_done):
                self.raise_if_diverged(interval)  # before the weights: a checkpoint of non-finite ones is refused
                self.save()
            if self.monitor.stopped or state.step == max_steps:  # the same step on every rank
                break  # (a stop signal now changes nothing: the run saves and ends)
            if stop.should_stop():
                self.stop(stop)
        if interval.steps:
            self.log_interval(interval, bar)

    def train_step(self, step: OptimizerStep, interval: Interval) -> None:
        """One optimizer step over its micro-batches; gradients all-reduced once, with the last."""
        state = self.state
        for watch in self.watches:
            watch.begin_step(state.step + 1)
        if self.schedule.length.by_steps:
            self.schedule.before_step(state.step + 1)
        else:  # in epochs, counted in samples: the same curve at any world size
            epochs_done = (state.samples_in_epoch + step.real_samples) / self.data.sampler.dataset_size
            self.schedule.before_step(state.epoch + epochs_done)
        if self.callbacks.step_start:
            self.callbacks.fire("on_step_start")
        interval.lr = self.optimizer.param_groups[0]["lr"]
        seen: list[tuple[torch.Tensor, torch.Tensor]] = []  # the step's samples, on the host: the divergence watch's
        for number, batch in enumerate(step.micro_batches, 1):
            if self.divergence is not None:
                seen.append((batch.indices, batch.weights))
            if self.throughput.tokens_per_sample is None:  # once: a sequence's tokens, where the task counts them
                self.throughput.count_tokens(self.task, batch.targets, self.model)
            interval.loss_sum += self.runner.micro_step(
                batch.inputs, batch.targets, batch.weights, step.real_samples, sync=number == step.count
            )
            if self.sample_audit.enabled:
                indices = batch.indices[batch.weights.cpu() > 0].tolist()
                self.sample_audit.write("samples", step=state.step + 1, epoch=state.epoch, indices=indices)
        pairs = self.runner.items is not None
        if pairs:  # a (total, count) loss: the log line's loss is the totals over the counts
            interval.items += self.runner.items.to(interval.items)  # type: ignore[union-attr]
        grad_norm = self.runner.optimizer_step()
        if pairs:  # on the device: the steps whose global count was 0 (no gradient from their data)
            interval.pairs = True
            interval.empty += (self.runner.step_count == 0).to(interval.empty)  # type: ignore[union-attr]
        if self.grad_norms is None:
            self.grad_norms = torch.zeros((), device=grad_norm.device)
        self.grad_norms += grad_norm
        if self.divergence is not None:
            self.divergence.note(state.step + 1, seen, interval.loss_sum, self.grad_norms)
        self.schedule.after_step()
        self.ema.update(state.step + 1)
        self.checkpoints.raise_if_failed()  # a background write that failed stops the run here
        state.step += 1
        state.samples_in_epoch += step.real_samples
        interval.steps += 1
        interval.samples += step.real_samples
        if self.callbacks.step_end:
            self.callbacks.fire("on_step_end")

    def end_epoch(self) -> None:
        """Move on to the next epoch (its order starts from the beginning)."""
        self.state.epoch, self.state.samples_in_epoch = self.state.epoch + 1, 0

    def interval_sums(self, interval: Interval) -> list[float]:
        # One all-reduce and one read-back per log line: the loss summed over the ranks, the gradient
        # norm (the same on every rank) and the items of a (total, count) loss with it, on the loss's
        # device (the CPU where the shards are offloaded there); the empty steps (the same on every rank) after it.
        grad_norms = self.grad_norms if self.grad_norms is not None else torch.zeros_like(interval.loss_sum)
        figures = [interval.loss_sum, grad_norms.to(interval.loss_sum), interval.items.to(interval.loss_sum)]
        sums = torch.cat([all_reduce_sum(torch.stack(figures)), interval.empty.to(interval.loss_sum)[None]]).tolist()
        if self.diverged(sums[0], sums[1]):  # the same sums on every rank: all stop at this step
            if self.divergence is not None and self.divergence.enabled:
                raise self.divergence.stop(self.env, self.run_dir, self.state.step - interval.steps + 1,
                                           self.state.epoch, self.model, self.runner.params)  # fmt: skip
            what = "loss" if not math.isfinite(sums[0]) else "gradient"
            raise JobError(f"training diverged by step {self.state.step}: the {what} is not finite; lower optim.lr or "
                           "set trainer.clip_grad_norm, then resume from the last checkpoint (it holds finite "
                           "weights)")  # fmt: skip
        return sums

    def raise_if_diverged(self, interval: Interval) -> None:
        """The log line's check of the steps so far, before a checkpoint or a validation meets non-finite weights."""
        if interval.steps:
            self.interval_sums(interval)

    def log_interval(self, interval: Interval, progress_bar: Any = None) -> None:
        sums = self.interval_sums(interval)
        elapsed = time.perf_counter() - interval.started
        # Per sample: the mean of the steps' losses; pairs: all the interval's totals over all its items
        # (none counted: no loss to say, NaN, and not a divergence: the weights took no gradient).
        if interval.pairs:
            train_loss = sums[0] / sums[2] if sums[2] else math.nan
        else:
            train_loss = sums[0] / (self.env.world_size * interval.steps)
        if interval.pairs and not sums[2] and self.env.is_main:
            log.warning("step %d: train_loss is NaN: the %d step%s since the last log line counted no items (every "
                        "target masked?) and took no gradient", self.state.step, interval.steps,
                        "s" * (interval.steps > 1))  # fmt: skip
        values = {
            "step": self.state.step,
            "epoch": self.state.epoch,
            "train_loss": train_loss,
            "lr": interval.lr,
            "samples_per_s": interval.samples / max(elapsed, 1e-9),
            "grad_norm": sums[1] / (self.env.world_size * interval.steps),  # before clipping; the interval's mean
            **self.throughput.figures(interval.samples / max(elapsed, 1e-9), self.env),
        }
        if interval.pairs:  # a (total, count) loss: its optimizer steps whose global count was 0
            values["empty_steps"] = int(sums[3])
        self.metrics.write("train", **values)
        empty = f" empty_steps={values['empty_steps']}" if values.get("empty_steps") else ""
        log.info("epoch %d step %d: train_loss=%.4f lr=%.4g grad_norm=%.4g %.0f samples/s%s", values["epoch"],
                 values["step"], train_loss, values["lr"], values["grad_norm"], values["samples_per_s"],
                 empty)  # fmt: skip
        if progress_bar is not None:
            progress_bar.set_postfix(
                step=values["step"], loss=f"{train_loss:.4f}", img_per_s=f"{values['samples_per_s']:.0f}"
            )
        interval.reset()
        if self.divergence is not None:
            self.divergence.reset()
        if self.grad_norms is not None:
            self.grad_norms.zero_()

    def validation(self) -> EvalResult:
        """Validate at this step and record it: metrics.jsonl (and the sinks), then the callbacks."""
        result = self.last_result = self.validate_all()
        self.validated_at = self.state.step
        if (why := result.uncounted()) and self.env.is_main:  # NaN: the monitor ranks and counts it as no improvement
            log.warning("step %d: %s", self.state.step, why)
        self.metrics.write("val", step=self.state.step, epoch=self.state.epoch, **result.record())
        self.metrics.write_tables(result.tables, step=self.state.step, epoch=self.state.epoch)  # val_<name>.jsonl
        self.callbacks.fire("on_validation_end", result.record())
        return result

    def judge(self, result: EvalResult) -> EvalResult:
        """The scheduler and the monitor see a validation: a checkpoint where it is one of the best, or a stop."""
        record = result.record()
        if self.schedule.needs_metric:  # ReduceLROnPlateau: before the checkpoints below, which hold its state
            self.schedule.after_validation(float(record[self.monitor.key]))
        if self.monitor.observe(self.state.step, record):
            self.checkpoints.keep_best(self.monitor.kept_steps())
            self.save()
        if self.monitor.stopped:
            self.save()
            log.info("stopping early at step %d: %s", self.state.step, self.monitor.stopped)
        return result

    def validate(self, loader: Any = None) -> EvalResult:
        """The task's figures over the validation set (or `loader`), as every strategy evaluates."""
        self.strategy.sync_buffers()  # rank 0's buffers (BatchNorm statistics) on every rank
        lockstep = self.strategy.lockstep_evaluation
        loader = self.data.val_loader if loader is None else loader
        with self.ema.swapped_in():  # trainer.ema: the average is what is validated
            return evaluate(self.model, loader, self.task, self.env.device, lockstep=lockstep)

    def validate_all(self) -> EvalResult:
        """The validation set's figures, then each of data.val_sets' as <name>_<metric>, each evaluated alike."""
        result = self.validate()
        for name, loader in self.data.val_sets.items():
            named = self.validate(loader)
            result = EvalResult(
                {**result.metrics, **{f"{name}_{key}": value for key, value in named.metrics.items()}},
                result.samples,
                result.nothing_counted + tuple(f"val_{name}_{key[4:]}" for key in named.nothing_counted),
                {**result.tables, **{f"{name}_{key}": value for key, value in named.tables.items()}},
            )
        return result

    def test(self) -> int:
        """data.test_set, evaluated exactly with the best checkpoint's weights (the last where keep_best is off): a
        "test" record and a log line. The step whose weights the model holds after it."""
        step = self.load_best()
        result = self.validate(self.data.test_loader)
        figures = {f"test_{name}": value for name, value in result.metrics.items()}
        self.metrics.write("test", step=step, epoch=self.state.epoch, **figures, test_samples=result.samples)
        shown = " ".join(f"{name}={value:.6f}" for name, value in figures.items())
        which = "the best" if self.monitor.kept_steps()[:1] == [step] else "the last"
        log.info("test, with the weights of step %d (%s): %s test_samples=%d", step, which, shown, result.samples)
        return step

    def load_best(self) -> int:
        """Load the weights and EMA of keep_best's best checkpoint (every rank the same one: agree_on_checkpoint;
        none holds it: the last weights stay); the step whose weights the model holds."""
        best = self.monitor.kept_steps()
        if not best or best[0] == self.state.step:
            return self.state.step
        writer = self.checkpoints.writer
        path = writer.folder / writer.name_of(best[0])
        found = agree_on_checkpoint(writer.readable(path) if path.exists() else None, self.env)
        if found is None:
            log.warning("the best checkpoint (step %d) is gone: the test evaluates the last weights", best[0])
            return self.state.step
        path, payload = found
        self.strategy.load_state_dict(payload, path)
        self.ema.load_state_dict(with_owner_tensors(payload, path, [self.ema]))
        return best[0]

    def save(self) -> float | None:
        """Checkpoint the current step; how long training was held (ms), None where nothing was written."""
        return self.checkpoints.save(self.state.step)

    def stop(self, stop: StopOnSigterm) -> NoReturn:
        """A signal every rank agreed on: checkpoint this step, wait for the write, stop."""
        self.save()
        self.checkpoints.wait()
        signum = stop.agreed
        if self.env.is_main:  # the launcher reads it: torchrun's own exit code does not say
            write_marker(self.run_dir, STOPPED_MARKER, f"{signum}\n")
        raise Preempted(f"stopped by {stop.signal_name} after step {self.state.step}; checkpoint saved", signum)

    def finished(self) -> bool:
        """Whether the run has trained all it will (run_finished, of this state)."""
        trainer = self.config.trainer
        return run_finished(self.state.state_dict() | self.monitor.state_dict(), trainer.epochs, trainer.max_steps)


class StepRunner:
    """Forward and backward of micro-batches, then the optimizer step, as the trainer config and the strategy say.
    Gradients are reduced with a step's last micro-batch only (docs/speed.md's grad_accum_steps)."""

    def __init__(
        self,
        trained: nn.Module,
        optimizer: torch.optim.Optimizer,
        config: TrainerConfig,
        device: torch.device,
        world_size: int,
        task: Task,
        strategy: Strategy,
    ) -> None:
        self.trained, self.optimizer, self.device, self.world_size = trained, optimizer, device, world_size
        self.task, self.strategy = task, strategy
        self.dtype = AUTOCAST_DTYPES[config.precision] if strategy.autocasts else None
        self.memory_format = torch.channels_last if config.channels_last else torch.contiguous_format
        self.clip_grad_norm = config.clip_grad_norm
        self.params = [p for group in optimizer.param_groups for p in group["params"]]  # what clipping sees
        # fp16's narrow range needs loss scaling; bf16 has fp32's range and does not.
        self.scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")
        self.items: torch.Tensor | None = None  # a (total, count) loss: the step's local count so far
        # What looks at the gradients before clipping, which spreads one NaN to every gradient (the trainer's
        # divergence watch, where the project has one)
        self.before_clipping: Callable[[list[torch.Tensor]], None] | None = None
        self.step_count: torch.Tensor | None = None  # and the last step's global count, on the device

    def micro_step(
        self, inputs: Any, targets: Any, weights: torch.Tensor, real_samples: int, sync: bool
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch (`sync`: the step's last); what the log line sums of it: a
        per-sample loss's share of the step's loss, or a pair's total (its count added to `self.items`)."""
        inputs = to_device(inputs, self.device, self.memory_format)
        targets = to_device(targets, self.device)
        weights = weights.to(self.device, non_blocking=True)
        with self.strategy.gradient_sync(self.trained, sync):
            # fp32: no autocast context at all (a disabled one still saves and restores its state every micro-step)
            with torch.autocast(self.device.type, dtype=self.dtype) if self.dtype else contextlib.nullcontext():
                outputs = model_forward(self.trained, inputs)
            with sample_weights(weights):  # what gather_with_grad marks as padding
                loss = self.task.loss(outputs, targets)
            if isinstance(loss, tuple):
                return self.pair_backward(*loss, real=weights.sum() > 0)
            # DDP averages gradients over ranks; scaling by world_size / real_samples makes that
            # average the mean over exactly the real samples of the step's global batch (all its
            # micro-batches), also when the last one is short or uneven: padding (weight 0) adds nothing.
            loss = (loss * weights).sum() * (self.world_size / real_samples)
            self.scaler.scale(loss).backward()
        return loss.detach()

    def pair_backward(self, total: torch.Tensor, count: Any, real: torch.Tensor) -> torch.Tensor:
        """Backward of a (total, count) loss's total, rescaled once the step's global count is known (rescale).
        The sampler's padding counts and adds nothing, but runs its backward as every rank must."""
        total = total * real  # 0 for padding: its gradient is zero, its graph still reaches every parameter
        count = torch.as_tensor(count, dtype=torch.float64, device=self.device) * real
        self.items = count if self.items is None else self.items + count
        self.scaler.scale(total).backward()
        return total.detach()

    def rescale(self) -> None:
        """The totals' gradients (averaged over the ranks) times world_size / the step's global count: the
        gradient of the sum of totals over the sum of counts; one all-reduce of one number a step."""
        items, self.items = all_reduce_sum(self.items), None  # type: ignore[arg-type]
        self.step_count = items
        # No items (every target masked): the totals' gradients are 0, and times a finite factor stay 0. The
        # step still runs (a stateful optimizer's momentum and weight decay act as on any zero gradient):
        # skipping it would need the count on the host, a read-back every step.
        factor = (self.world_size / items.clamp_min(1)).float()
        grads: dict[torch.device, list[torch.Tensor]] = {}
        for param in self.params:
            if param.grad is not None:
                grad = param.grad.to_local() if is_sharded(param.grad) else param.grad
                grads.setdefault(grad.device, []).append(grad)
        for device, tensors in grads.items():  # shards offloaded to the CPU: their gradients are there
            torch._foreach_mul_(tensors, factor.to(device))

    def optimizer_step(self) -> torch.Tensor:
        """Clip, step, clear the gradients, then the strategy's after_step; the norm before clipping, on the device."""
        if self.scaler.is_enabled():  # fp16: the norm of the true gradients (step() knows they are unscaled)
            self.scaler.unscale_(self.optimizer)
        if self.items is not None:  # a (total, count) loss: the global count is known now
            self.rescale()
        if self.before_clipping is not None:
            self.before_clipping(self.params)
        if self.clip_grad_norm > 0:
            norm = nn.utils.clip_grad_norm_(self.params, self.clip_grad_norm)
        else:  # the same norm clipping computes (frozen parameters have no gradient: left out)
            norm = nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
        if is_sharded(norm):  # sharded gradients: the norm over every rank's shards
            norm = norm.full_tensor()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.strategy.after_step()
        return norm.detach()

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's `grad_scaler`: fp16's loss scale; empty otherwise."""
        return {"grad_scaler": self.scaler.state_dict() if self.scaler.is_enabled() else {}}

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        if payload["grad_scaler"] and self.scaler.is_enabled():
            self.scaler.load_state_dict(payload["grad_scaler"])


@dataclass
class Interval:
    """Loss and sample counts since the last log line, kept on the device: no sync per step."""

    loss_sum: torch.Tensor
    items: torch.Tensor = field(default_factory=lambda: torch.zeros(()))  # a (total, count) loss's counts
    empty: torch.Tensor = field(default_factory=lambda: torch.zeros(()))  # its steps whose global count was 0
    pairs: bool = False  # whether the loss is a (total, count) pair
    steps: int = 0
    lr: float = 0.0  # the learning rate of the last step (a scheduler has set the next one's since)
    samples: int = 0
    started: float = field(default_factory=time.perf_counter)

    def reset(self) -> None:
        self.loss_sum.zero_()
        self.items.zero_()
        self.empty.zero_()
        self.steps, self.samples, self.started = 0, 0, time.perf_counter()


@dataclass
class OptimizerStep:
    """One optimizer step: its micro-batches (read once, in order) and its real sample count."""

    micro_batches: Iterator[Batch]
    count: int  # micro-batches in the step: grad_accum_steps, fewer at the epoch's end
    real_samples: int  # non-padding samples in the step's global batch, over all ranks


def optimizer_steps(
    batches: Iterable[Batch], sampler: ResumableDistributedSampler, accum: int
) -> Iterator[OptimizerStep]:
    """The rest of the epoch's micro-batches, grouped into optimizer steps of `accum` each."""
    batches, left, samples_done = iter(batches), sampler.steps_left(), sampler.start
    while left > 0:
        count = min(accum, left)
        real_samples = sampler.real_samples_in_step(samples_done, count)
        yield OptimizerStep(itertools.islice(batches, count), count, real_samples)
        left, samples_done = left - count, samples_done + real_samples


def divergence_module() -> ModuleType | None:
    """The module of engine/ with a `divergence_watch` (what names a divergence's step, ranks, samples and parameter),
    where the project has one (docs/troubleshooting.md); without it a divergence stops the run all the same."""
    found = modules_with(__package__, [str(Path(__file__).parent)], "def divergence_watch(")
    return next((module for module in found if hasattr(module, "divergence_watch")), None)

"""The training loop: build, resume, train epoch by epoch, evaluate, checkpoint."""

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
from torch import nn

from .checkpoint import (
    FORMAT_VERSION,
    Checkpointer,
    TrainState,
    agree_on_checkpoint,
    check_format_version,
    restore,
)
from .comm_hooks import hook_state_dict, load_hook_state, register_comm_hook
from .compatibility import check_resumable
from .components import build_model, build_optimizer, build_task
from .config import JobError, TrainConfig, first_line, to_plain_dict
from .data import Data, build_data
from .distributed import DistEnv, all_reduce_sum, sync_buffers_from_rank_zero, weights_fingerprint, wrap_ddp
from .evaluate import EvalResult, evaluate
from .fsdp import finite, full_state_dict, is_sharded, load_full_state, shard_model, sharded_state
from .hangs import StallWatch, build_stall_watch
from .logs import MetricsLog, use_progress_bar
from .models import count_parameters
from .optim import lr_at, set_lr
from .preemption import Preempted, StopOnSigterm
from .profiling import Profiler, build_profiler
from .randomness import gather_rank_states, restore_rank_state, seed_rank
from .rundir import FINISHED_MARKER, STOPPED_MARKER, write_marker
from .sampler import ResumableDistributedSampler
from .step import StepRunner, use_deterministic_kernels
{%- if cookiecutter.tensorboard == "yes" %}
from .tensorboard_log import TensorBoardLog
{%- endif %}
{%- if cookiecutter.mlflow == "yes" or cookiecutter.wandb == "yes" %}
from .trackers import Trackers
{%- endif %}

log = logging.getLogger(__name__)


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
    model: nn.Module  # the user's model, unwrapped (runner.ddp_model is what trains); sharded in place under fsdp
    optimizer: torch.optim.Optimizer
    data: Data
    task: Any  # the loss and the metrics (tasks.py)
    runner: StepRunner  # forward, backward and the optimizer step
    comm_hook: Any  # the PowerSGD hook, whose memory is checkpointed; None for the others
    checkpoints: Checkpointer
    metrics: MetricsLog
    sample_audit: MetricsLog  # logs/samples_rank_<R>.jsonl, when trainer.record_samples is on
    plain_config: dict[str, Any]  # the config as a checkpoint stores it
    stalls: StallWatch  # a rank that stalls is named; DEBUG=1 keeps every rank's stacks (hangs.py)
    profiler: Profiler  # trainer.profile_steps (profiling.py); a no-op without it
{%- if cookiecutter.mlflow == "yes" or cookiecutter.wandb == "yes" %}
    trackers: Trackers  # the experiment-tracker runs (trackers.py), fed by rank 0
{%- endif %}
    state: TrainState = field(default_factory=TrainState)

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint holds (a collective: every rank calls it at the same point)."""
        if is_sharded(self.model):  # this rank's shards, by parameter name: a sharded checkpoint's part
            tensors = sharded_state(self.model, self.optimizer)
        else:
            tensors = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        return {
            "format_version": FORMAT_VERSION,
            **asdict(self.state),
            **tensors,
            "grad_scaler": self.runner.state_dict(),  # fp16's loss scale; empty otherwise
            "comm_hook": hook_state_dict(self.comm_hook),  # PowerSGD's memory, gathered on rank 0
            "rank_states": gather_rank_states(self.env.device),  # dropout and the like resume exactly
            "world_size": self.env.world_size,
            "config": self.plain_config,
{%- if cookiecutter.mlflow == "yes" or cookiecutter.wandb == "yes" %}
            "trackers": self.trackers.state_dict(),  # their run ids: a resume continues the same runs
{%- endif %}
        }

    def load_state_dict(self, payload: dict[str, Any], source: Path | str = "checkpoint") -> None:
        """The exact inverse of state_dict(), at this world size (the generator states last). A
        payload without tensors is a sharded checkpoint's trainer.pt: they load from its folder."""
        check_format_version(source, payload)
        changes = check_resumable(source, payload, self.plain_config, self.config.trainer.epochs)
        if "model" not in payload:
            from .sharded_checkpoint import load_sharded  # torch.distributed.checkpoint: 1.7 s to import

            load_sharded(Path(source), self.model, self.optimizer)  # resharded to this world size
        elif is_sharded(self.model):  # a ddp checkpoint continues under fsdp
            load_full_state(self.model, self.optimizer, payload["model"], payload["optimizer"])
        else:
            restore(self.model, payload, source)
            self.optimizer.load_state_dict(payload["optimizer"])
        self.state = TrainState(payload["epoch"], payload["step"], payload["samples_in_epoch"])
        self.runner.load_state_dict(payload["grad_scaler"])
        load_hook_state(self.comm_hook, payload["comm_hook"])
{%- if cookiecutter.mlflow == "yes" or cookiecutter.wandb == "yes" %}
        self.trackers.load_state_dict(payload.get("trackers", {}))  # none in checkpoints from before trackers
{%- endif %}
        env = self.env
        if not restore_rank_state(
            payload["rank_states"], self.config.seed, self.state.step, env.rank, env.world_size, env.device
        ):
            log.info("generator states seeded afresh for %d processes: other dropout masks than saved", env.world_size)
        log.info(
            "resumed from %s: epoch %d, step %d, %d samples into the epoch (saved by %d processes, now %d)",
            source, self.state.epoch, self.state.step, self.state.samples_in_epoch, payload["world_size"],
            env.world_size,
        )  # fmt: skip
        if changes:
            log.info("resumed with settings other than the checkpoint's: %s", "; ".join(changes))

    def resume(self) -> tuple[Path, dict[str, Any]] | None:
        """Load the checkpoint checkpoint.resume names (the run dir's newest, by default); None if none.
        A sharded one whose shards fail to load (every rank learns it) is set aside for the one before."""
        skip: set[Path] = set()
        while found := agree_on_checkpoint(self.checkpoints.find_resume_payload(frozenset(skip)), self.env):
            try:
                self.load_state_dict(found[1], found[0])
                return found
            except BaseException as error:  # DCP's CheckpointException is a BaseException
                from torch.distributed.checkpoint.api import CheckpointException  # slow to import: when needed

                if not isinstance(error, CheckpointException):
                    raise
                log.warning("checkpoint %s does not load (%s); trying the one before", found[0], first_line(error))
                self.checkpoints.set_aside(found[0])
                skip.add(found[0])
        return None

    def save(self) -> float | None:
        """Checkpoint the current step; how long training was held (ms), None where nothing was written."""
        started = time.perf_counter()
        # Never a checkpoint of non-finite weights: they would rotate the good ones out. DDP keeps
        # the weights equal on every rank; fsdp's ranks sum their shards' answers: all stop alike.
        if not finite_weights(self.model):
            raise JobError(
                f"training diverged by step {self.state.step}: the weights are not finite, so no checkpoint was "
                "written; lower optim.lr or set trainer.clip_grad_norm, then resume from the last checkpoint"
            )
        state = self.state_dict()
        if not self.checkpoints.save(self.state.step, state):
            return None
        held_ms = 1e3 * (time.perf_counter() - started)
        log.info("checkpoint of step %d: training held %.1f ms, writing in the background", self.state.step, held_ms)
        return held_ms

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
        every_n = config.checkpoint.every_n_steps
        for step in optimizer_steps(batches, sampler, config.trainer.grad_accum_steps):
            self.train_step(step, interval)
            if state.step % config.trainer.log_every_n_steps == 0:
                self.log_interval(interval, bar)
            if every_n and state.step % every_n == 0 and state.samples_in_epoch < sampler.dataset_size:
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
        sync_buffers_from_rank_zero(self.model)
        return evaluate(self.model, self.data.val_loader, self.task, self.env.device, lockstep=is_sharded(self.model))

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
        # validate() gave every rank rank 0's buffers; DDP kept the parameters equal: each rank logs
        # its own (the same). Under fsdp rank 0 gathers the whole weights: ddp's fingerprint for them.
        weights = full_state_dict(self.model, rank_zero_only=True)
        if weights:
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


def finite_weights(model: nn.Module) -> bool:
    """Whether every floating-point tensor of the model is finite (one read back to the host); under
    fsdp, of every rank's shards (a collective)."""
    finite_here = finite(model)
    if is_sharded(model):
        return int(all_reduce_sum(1 - finite_here).item()) == 0
    return bool(finite_here)


def prepare_model(config: TrainConfig, env: DistEnv) -> nn.Module:
    """The configured model on this rank's device, in its memory layout, BatchNorm synced if asked."""
    model = build_model(config.model)
    if config.ddp.sync_batchnorm and env.world_size > 1:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    layout = torch.channels_last if config.trainer.channels_last else torch.preserve_format
    return model.to(env.device, memory_format=layout)


def build_trainer(config: TrainConfig, env: DistEnv, run_dir: Path) -> Trainer:
    """Everything the loop needs, resumed from a checkpoint when there is one."""
    torch.manual_seed(config.seed)
    use_deterministic_kernels(config.trainer.deterministic)
    data = build_data(config.data, env, config.seed)
    task = build_task(config.task)
    model = prepare_model(config, env)
    sharded = config.strategy == "fsdp"
    if sharded:  # before the optimizer, which must step on the shards
        shard_model(model, config.fsdp, config.trainer.precision, env.world_size)
    optimizer = build_optimizer(config.optim, model)
    log.info(
        "model %s (%d parameters) on %s, backend %s, world size %d, %d samples per process per step",
        config.model["_target_"], count_parameters(model), env.device, env.backend, env.world_size,
        config.data.batch_size,
    )  # fmt: skip
    # The compiled module shares the model's parameters; checkpoints keep the plain model's names.
    compiled = torch.compile(model) if config.trainer.compile else model
    ddp_model = compiled if sharded else wrap_ddp(compiled, config.ddp, env)
    if sharded:
        from .sharded_checkpoint import ShardedCheckpointer as saver  # torch.distributed.checkpoint: slow to import
    else:
        saver = Checkpointer
    checkpoints = saver(run_dir / "checkpoints", config.checkpoint, is_writer=env.is_main)
    runner = StepRunner(ddp_model, optimizer, config.trainer, env.device, env.world_size, task, autocast=not sharded,
                        sync_buffers=sharded)  # fmt: skip
    trainer = Trainer(
        config=config,
        env=env,
        run_dir=run_dir,
        model=model,
        optimizer=optimizer,
        data=data,
        task=task,
        runner=runner,
        comm_hook=None if sharded else register_comm_hook(ddp_model, config.ddp, env),
        checkpoints=checkpoints,
        metrics=MetricsLog(run_dir / "metrics.jsonl", enabled=env.is_main),
        sample_audit=MetricsLog(run_dir / "logs" / f"samples_rank_{env.rank}.jsonl", config.trainer.record_samples),
        plain_config=to_plain_dict(config),
        stalls=build_stall_watch(env.rank, env.world_size, config.dist.timeout_s),
        profiler=build_profiler(config.trainer, run_dir, env),
{%- if cookiecutter.mlflow == "yes" or cookiecutter.wandb == "yes" %}
        trackers=Trackers(config.log, run_dir),
{%- endif %}
    )
    checkpoints.save_config(trainer.plain_config)
    found = trainer.resume()
    if found is None:  # last, so that nothing above draws from them: each rank's own generators (dropout)
        seed_rank(config.seed, 0, env.rank)
    trainer.metrics.drop_after(trainer.state.step)
{%- if cookiecutter.tensorboard == "yes" %}
    if config.log.tensorboard and env.is_main:
        trainer.metrics.sinks.append(TensorBoardLog(run_dir / "tb", purge_step=trainer.state.step + 1))
{%- endif %}
{%- if cookiecutter.mlflow == "yes" or cookiecutter.wandb == "yes" %}
    if env.is_main:  # a record reaches the trackers once a checkpoint covers its step: no resume redoes it
        own_checkpoint = found is None or found[0] != Path(config.checkpoint.resume)  # not another run's
        trainer.trackers.start(trainer.state.step, trainer.metrics.path, trainer.plain_config, own_checkpoint)
        trainer.metrics.sinks.append(trainer.trackers)
        checkpoints.on_written.append(trainer.trackers.commit)
{%- endif %}
    return trainer

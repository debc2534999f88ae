"""The training loop: build, resume, train epoch by epoch, evaluate, checkpoint."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoint import Checkpointer, TrainState, agree_on_checkpoint, check_same_model, restore
from .comm_hooks import hook_state_dict, register_comm_hook
from .components import build_model, build_optimizer, build_task
from .config import JobError, TrainConfig, to_plain_dict
from .data import Data, build_data
from .distributed import DistEnv, all_reduce_sum, sync_buffers_from_rank_zero, weights_fingerprint, wrap_ddp
from .evaluate import EvalResult, evaluate
from .logs import MetricsLog, use_progress_bar
from .models import count_parameters
from .optim import lr_at, set_lr
from .preemption import STOPPED_MARKER, Preempted, StopOnSigterm
from .randomness import gather_rank_states, restore_rank_state
from .step import StepRunner, use_deterministic_kernels
{%- if cookiecutter.tensorboard == "yes" %}
from .tensorboard_log import TensorBoardLog
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
class Trainer:
    config: TrainConfig
    env: DistEnv
    run_dir: Path
    model: nn.Module  # the user's model, unwrapped (step.ddp_model is what trains)
    optimizer: torch.optim.Optimizer
    data: Data
    checkpoints: Checkpointer
    metrics: MetricsLog
    samples: MetricsLog  # the sample audit, when trainer.record_samples is on
    state: TrainState
    plain_config: dict[str, Any]  # the config as a checkpoint stores it
    comm_hook: Any  # the PowerSGD hook, whose memory is checkpointed; None for the others
    step: StepRunner
    task: Any  # the loss and the metrics (tasks.py)

    def components(self) -> dict[str, Any]:
        """Everything a checkpoint holds besides the TrainState counters."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {"lr": self.optimizer.param_groups[0]["lr"]},  # the LR is a function of progress
            "grad_scaler": self.step.state_dict(),  # fp16's loss scale; empty otherwise
            "world_size": self.env.world_size,
            "config": self.plain_config,
        }

    def save(self) -> None:
        started = time.perf_counter()
        # Never a checkpoint of non-finite weights: they would rotate the good ones out. DDP keeps
        # the weights equal on every rank, so every rank stops here alike.
        if not finite_weights(self.model):
            raise JobError(
                f"training diverged by step {self.state.step}: the weights are not finite, so no checkpoint was "
                "written; lower optim.lr or set trainer.clip_grad_norm, then resume from the last checkpoint"
            )
        hook_state = hook_state_dict(self.comm_hook)  # a collective when PowerSGD is on
        rank_states = gather_rank_states(self.env.device)  # a collective: dropout and the like resume exactly
        if not self.checkpoints.is_writer:
            return
        payload = {**self.components(), "comm_hook": hook_state, "rank_states": rank_states}
        if self.checkpoints.save(self.state, payload):
            held_ms = 1e3 * (time.perf_counter() - started)
            log.info(
                "checkpoint of step %d: training held %.1f ms, writing in the background", self.state.step, held_ms
            )

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

    def train_epoch(self, stop: StopOnSigterm) -> None:
        config, state, sampler = self.config, self.state, self.data.sampler
        epoch, dataset_size = state.epoch, sampler.dataset_size
        sampler.set_epoch(epoch)  # a new order every epoch: the classic forgotten call
        sampler.set_start(state.samples_in_epoch)  # mid-epoch after a resume
        interval = Interval(torch.zeros((), device=self.env.device))
        batches: Any = self.data.train_loader
        bar = None
        if use_progress_bar(self.env):
            from tqdm import tqdm

            batches = bar = tqdm(batches, total=sampler.steps_left(), desc=f"epoch {epoch}", leave=False)
        every_n, accum = config.checkpoint.every_n_steps, config.trainer.grad_accum_steps
        micro_left, micro, group = sampler.steps_left(), 0, 0  # micro-batches: left, done in this step, in it
        for inputs, targets, weights, indices in batches:
            if micro == 0:  # a new optimizer step: accum micro-batches, fewer at the epoch's end
                group = min(accum, micro_left)
                real_samples = sampler.real_samples_in_step(state.samples_in_epoch, group)
                progress = epoch + (state.samples_in_epoch + real_samples) / dataset_size
                set_lr(self.optimizer, lr_at(config.optim, progress, config.trainer.epochs))
            micro, micro_left = micro + 1, micro_left - 1
            interval.loss_sum += self.step.micro_step(inputs, targets, weights, real_samples, sync=micro == group)
            if self.samples.enabled:
                indices = indices[weights.cpu() > 0].tolist()
                self.samples.write("samples", step=state.step + 1, epoch=epoch, indices=indices)
            if micro < group:
                continue
            micro = 0
            self.step.optimizer_step()
            self.checkpoints.raise_if_failed()  # a background write that failed stops the run here
            state.step += 1
            state.samples_in_epoch += real_samples
            interval.steps += 1
            interval.samples += real_samples
            if state.step % config.trainer.log_every_n_steps == 0:
                self.log_interval(interval, bar)
            if every_n and state.step % every_n == 0 and state.samples_in_epoch < dataset_size:
                self.save()
            if stop.should_stop():
                self.save()
                self.checkpoints.wait()
                signum = stop.agreed
                if self.env.is_main:  # the launcher reads it: torchrun's own exit code does not say
                    (self.run_dir / STOPPED_MARKER).write_text(f"{signum}\n")
                raise Preempted(f"stopped by {stop.signal_name} after step {state.step}; checkpoint saved", signum)
        if interval.steps:
            self.log_interval(interval, bar)

    def validate(self) -> EvalResult:
        sync_buffers_from_rank_zero(self.model)
        return evaluate(self.model, self.data.val_loader, self.task, self.env.device)

    def fit(self) -> EvalResult:
        """Train the remaining epochs and return the last evaluation."""
        stop = StopOnSigterm()
        try:
            result = self.train_epochs(stop)
        except BaseException:
            stop.close(wait=False)  # a peer may be gone: waiting for it could hang
            raise
        else:
            stop.close()
        finally:
            self.checkpoints.wait()  # the end of the job waits for the last write
            self.metrics.close()
        if result is None:
            log.info("training had already finished at step %d; evaluating", self.state.step)
            result = self.validate()
        # validate() gave every rank rank 0's buffers; DDP kept the parameters equal.
        log.info("weights at step %d: sha256 %s", self.state.step, weights_fingerprint(self.model))
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
            state.epoch, state.samples_in_epoch = state.epoch + 1, 0
            self.save()
        return result


def finite_weights(model: nn.Module) -> bool:
    """Whether every floating-point tensor of the model is finite (one read back to the host)."""
    checks = [torch.isfinite(tensor).all() for tensor in model.state_dict().values() if tensor.is_floating_point()]
    return bool(torch.stack(checks).all()) if checks else True


def build_trainer(config: TrainConfig, env: DistEnv, run_dir: Path) -> Trainer:
    """Everything the loop needs, resumed from a checkpoint when there is one."""
    torch.manual_seed(config.seed)
    use_deterministic_kernels(config.trainer.deterministic)
    data = build_data(config.data, env, config.seed)
    task = build_task(config.task)
    model = build_model(config.model)
    if config.ddp.sync_batchnorm and env.world_size > 1:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model.to(env.device, memory_format=torch.channels_last if config.trainer.channels_last else torch.preserve_format)
    optimizer = build_optimizer(config.optim, model)
    checkpoints = Checkpointer(run_dir / "checkpoints", config.checkpoint, is_writer=env.is_main)
    plain_config = to_plain_dict(config)
    checkpoints.save_config(plain_config)
    state = TrainState()
    found = agree_on_checkpoint(checkpoints.find_resume_payload(), env)
    if found is not None:
        path, payload = found
        check_same_model(path, payload.get("config", {}), plain_config)
        restore(model, payload, path)
        optimizer.load_state_dict(payload["optimizer"])
        state = TrainState(payload["epoch"], payload["step"], payload["samples_in_epoch"])
        log.info(
            "resumed from %s: epoch %d, step %d, %d samples into the epoch (saved by %d processes, now %d)",
            path,
            state.epoch,
            state.step,
            state.samples_in_epoch,
            payload.get("world_size", 0),
            env.world_size,
        )
        checkpoints.last_saved_step = state.step
    metrics = MetricsLog(run_dir / "metrics.jsonl", enabled=env.is_main)
    metrics.drop_after(state.step)
{%- if cookiecutter.tensorboard == "yes" %}
    if config.log.tensorboard and env.is_main:
        metrics.sinks.append(TensorBoardLog(run_dir / "tb", purge_step=state.step + 1))
{%- endif %}
    samples = MetricsLog(run_dir / "logs" / f"samples_rank_{env.rank}.jsonl", enabled=config.trainer.record_samples)
    log.info(
        "model %s (%d parameters) on %s, backend %s, world size %d, %d samples per process per step",
        config.model["_target_"],
        count_parameters(model),
        env.device,
        env.backend,
        env.world_size,
        config.data.batch_size,
    )
    # The compiled module shares the model's parameters; checkpoints keep the plain model's names.
    ddp_model = wrap_ddp(torch.compile(model) if config.trainer.compile else model, config.ddp, env)
    hook_state = register_comm_hook(ddp_model, config.ddp, found[1].get("comm_hook") if found else None, env)
    step = StepRunner(ddp_model, optimizer, config.trainer, env.device, env.world_size, task)
    if found is not None:
        step.load_state_dict(found[1].get("grad_scaler", {}))
    # Last, so that nothing above draws from them: each rank's generators (dropout and the like).
    saved_states = found[1].get("rank_states") if found else None
    if not restore_rank_state(saved_states, config.seed, state.step, env.rank, env.world_size, env.device) and found:
        log.info("generator states seeded afresh for %d processes: other dropout masks than saved", env.world_size)
    return Trainer(
        config, env, run_dir, model, optimizer, data, checkpoints, metrics, samples, state, plain_config,
        hook_state, step, task,
    )  # fmt: skip

"""Everything the training loop needs, built from the config, then resumed from a checkpoint where there is one."""

from __future__ import annotations

import logging
import math
import os
from operator import attrgetter
from pathlib import Path
from typing import cast

import torch
from torch import nn

from ...common.placement import DistEnv
from ...common.run_dir import LOGS_DIR, METRICS_FILE
from ...config import TrainConfig, to_plain_dict
from ...config.batches import apply_global_batch
from ...config.strategies import BLOCKS
from ...models import count_parameters
from ...observe.logs import MetricsLog
from ...observe.sinks import build_sinks
from ..callbacks import Callbacks, CallbackStates, Run, build_callbacks
from ..checkpoint.files import list_checkpoints, local_folder
from ..checkpoint.manager import CheckpointManager
from ..data.loader import Data, build_data
from ..distributed.generators import RankGenerators
from ..ema import EMA, NoEMA
from ..evaluate import metric_names
from ..monitor import Monitor
from ..schedule import RunLength, Schedule
from ..state import TrainState
from ..strategies import Strategy, build_strategy
from ..trainer import StepRunner, Trainer, divergence_module
from .activation import checkpoint_activations
from .checks import Built
from .compatibility import SamePreparedData
from .components import build_model, build_optimizer, build_task, observe_modules, run_records
from .init_weights import initialise_from

log = logging.getLogger(__name__)


def use_deterministic_kernels(enabled: bool) -> None:
    """trainer.deterministic: the GPU kernels that make a resume bit-exact there (docs/checkpoints.md). Call
    before the first cuBLAS use: it reads the workspace setting when it creates its handle."""
    if not enabled:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def prepare_model(
    config: TrainConfig, env: DistEnv, strategy: Strategy, has_checkpoint: bool = False, built: nn.Module | None = None
) -> nn.Module:
    """The configured model (with model.init_from's weights), on this rank's device, as the strategy holds it.
    `built`: the model the start's checks built from the same seed, taken instead of building another."""
    if built is None:
        torch.manual_seed(config.seed)  # as the checks seed it: the same weights on every rank, whoever built them
    model = build_model(config.model) if built is None else built
    if config.model.get("init_from"):
        initialise_from(model, config.model["init_from"], env, has_checkpoint, config.trust_checkpoint)
    if config.trainer.activation_checkpointing:
        checkpoint_activations(model, attrgetter(BLOCKS)(config) if BLOCKS else [], BLOCKS)
    layout = torch.channels_last if config.trainer.channels_last else torch.preserve_format
    return strategy.prepare(model.to(env.device, memory_format=layout))  # type: ignore[call-overload]  # stubs lack it


def build_schedule(config: TrainConfig, optimizer: torch.optim.Optimizer, data: Data) -> Schedule:
    """The learning rate of each step: the scheduler group after its warm-up, over the run's length."""
    sampler = data.sampler
    steps_per_epoch = math.ceil(math.ceil(sampler.dataset_size / sampler.global_batch_size)
                                / config.trainer.grad_accum_steps)  # fmt: skip
    length = RunLength.of(config.scheduler, config.trainer.epochs, config.trainer.max_steps, steps_per_epoch)
    return Schedule(config.scheduler, optimizer, length, accepted=config.checkpoint.allow_changes)


def build_ema(config: TrainConfig, model: nn.Module) -> EMA | NoEMA:
    ema = config.trainer.ema
    if not ema.decay:
        return NoEMA()
    log.info("trainer.ema: validation, eval.py and the export use the average of the weights (decay %g, "
             "averaging after step %d)", ema.decay, ema.start_step)  # fmt: skip
    return EMA(model, ema.decay, ema.start_step)


def allow_frozen_parameters(config: TrainConfig, callbacks: Callbacks) -> None:
    """A callback that `freezes_parameters` under ddp turns ddp.find_unused_parameters on (docs/callbacks.md)."""
    freezing = [name for name, cb in callbacks.named.items() if getattr(cb, "freezes_parameters", False)]
    if freezing and config.strategy == "ddp" and not config.ddp.find_unused_parameters:
        log.info("callbacks.%s freezes parameters: ddp.find_unused_parameters=true", freezing[0])
        config.ddp.find_unused_parameters = True


def build_trainer(config: TrainConfig, env: DistEnv, run_dir: Path, built: Built | None = None) -> Trainer:
    """Everything the loop needs, in order, resumed where there is a checkpoint; `built`: the checks' (checks.py)."""
    torch.manual_seed(config.seed)
    use_deterministic_kernels(config.trainer.deterministic)
    apply_global_batch(config, env.world_size)  # data.global_batch_size: the batch and accumulation of this world
    callbacks = build_callbacks(config.callbacks)  # first: a wrong _target_ is said before any work
    allow_frozen_parameters(config, callbacks)
    data = build_data(config.data, env, config.seed)
    if (divergence := divergence_module()) is not None:  # samples to leave out: before the schedule counts the steps
        divergence.leave_out_samples(config.trainer, data.sampler, env.is_main)
    task = built.task if built else build_task(config.task)
    strategy = build_strategy(config, env)
    folder = local_folder(run_dir, config.checkpoint)  # checkpoint.dir, or the run dir's checkpoints/
    has_checkpoint = config.checkpoint.resume != "never" and bool(list_checkpoints(folder))
    # before the optimizer, which steps on what the strategy holds
    model = prepare_model(config, env, strategy, has_checkpoint, built.model if built else None)
    optimizer = build_optimizer(config.optim, model)
    schedule = build_schedule(config, optimizer, data)
    monitor = Monitor.of(config.checkpoint, config.trainer)
    schedule.check_monitor(monitor.key, monitor.mode)  # ReduceLROnPlateau: stepped with the monitored figure
    if monitor.enabled or schedule.needs_metric:  # a monitor the validation does not give: refused before any step
        monitor.check_names(metric_names(model, data.val_loader, task, env.device, data.val_sets))
    ema = build_ema(config, model)
    log.info(
        "model %s (%d parameters) on %s, backend %s, world size %d, %d samples per process per micro-batch, "
        "%d micro-batches per step", config.model["_target_"], count_parameters(model), env.device, env.backend,
        env.world_size, config.data.batch_size, config.trainer.grad_accum_steps,
    )  # fmt: skip
    # The compiled module shares the model's parameters; checkpoints keep the plain model's names.
    trained = strategy.wrap(cast(nn.Module, torch.compile(model)) if config.trainer.compile else model, optimizer)
    runner = StepRunner(trained, optimizer, config.trainer, env.device, env.world_size, task, strategy)
    state, generators = TrainState(), RankGenerators(config.seed, env)
    sinks = build_sinks(config.log, run_dir, env)  # what else receives the metrics (observe/sinks/)
    same_data = SamePreparedData(data.prepared, config.checkpoint.allow_changes)  # data prepared again: refused
    states = [CallbackStates(callbacks, env)] if callbacks.stateful() else []  # every rank's callbacks' states
    records = [module.RUN_RECORD.start(run_dir, env) for module in run_records()]  # rank 0: this start's, saved
    owners = [state, runner, schedule, monitor, ema, same_data, *records,  # the generators last
              *(sink for sink in sinks if hasattr(sink, "state_dict")), *states, generators]  # fmt: skip
    plain_config = to_plain_dict(config)
    watches = [module.build_watch(config, run_dir, env) for module in observe_modules("build_watch")]  # Watch
    checkpoints = CheckpointManager(
        folder, config.checkpoint, env, strategy, owners, plain_config, config.trainer.epochs, run_dir
    )
    if built is not None:  # check_launch looked for the checkpoint: not read again
        checkpoints.found_at_start = [built.resume]
    trainer = Trainer(
        config=config,
        env=env,
        run_dir=run_dir,
        strategy=strategy,
        model=model,
        optimizer=optimizer,
        data=data,
        task=task,
        runner=runner,
        checkpoints=checkpoints,
        metrics=MetricsLog(run_dir / METRICS_FILE, enabled=env.is_main),
        sample_audit=MetricsLog(run_dir / LOGS_DIR / f"samples_rank_{env.rank}.jsonl", config.trainer.record_samples),
        watches=tuple(watch for watch in watches if watch is not None),
        schedule=schedule,
        monitor=monitor,
        ema=ema,
        state=state,
        callbacks=callbacks,
    )
    callbacks.run = Run(trainer)
    found = checkpoints.resume()
    if monitor.keep_best:  # the best of the run so far, kept by the next prune
        checkpoints.keep_best(monitor.kept_steps())
    if found is None:  # last, so that nothing above draws from them: each rank's own generators (dropout)
        generators.start_afresh()
    trainer.metrics.drop_after(state.step)
    trainer.sample_audit.drop_after(state.step)  # the steps a kill cut short are redone and listed again
    if env.is_main:  # rank 0 feeds the sinks; a tracker's records wait for a checkpoint to cover them
        own_checkpoint = found is None or found[0] != Path(config.checkpoint.resume)  # not another run's
        params = {**plain_config, **{key: value for record in records for key, value in record.params().items()}}
        for sink in sinks:
            sink.start(state.step, trainer.metrics.path, params, own_checkpoint)
            trainer.metrics.sinks.append(sink)
            if hasattr(sink, "commit"):
                checkpoints.on_written.append(sink.commit)
    return trainer

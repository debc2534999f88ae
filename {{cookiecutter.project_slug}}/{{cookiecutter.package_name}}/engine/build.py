"""Everything the training loop needs, built from the config, then resumed from a checkpoint when
the run dir (or checkpoint.resume) holds one."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from ..config import TrainConfig, to_plain_dict
from ..models import count_parameters
from ..observe.hangs import build_stall_watch
from ..observe.logs import MetricsLog
from ..observe.profiling import build_profiler
from ..observe.sinks import build_sinks
from ..placement import DistEnv
from ..run_dir import LOGS_DIR, METRICS_FILE
from .checkpoint.files import local_folder
from .checkpoint.manager import CheckpointManager
from .components import build_model, build_optimizer, build_task
from .data import build_data
from .generators import RankGenerators
from .step import StepRunner, use_deterministic_kernels
from .strategies import Strategy, build_strategy
from .trainer import Trainer, TrainState

log = logging.getLogger(__name__)


def prepare_model(config: TrainConfig, env: DistEnv, strategy: Strategy) -> nn.Module:
    """The configured model on this rank's device, in its memory layout, as the strategy holds it."""
    layout = torch.channels_last if config.trainer.channels_last else torch.preserve_format
    return strategy.prepare(build_model(config.model).to(env.device, memory_format=layout))


def build_trainer(config: TrainConfig, env: DistEnv, run_dir: Path) -> Trainer:
    """Everything the loop needs, resumed from a checkpoint when there is one."""
    torch.manual_seed(config.seed)
    use_deterministic_kernels(config.trainer.deterministic)
    data = build_data(config.data, env, config.seed)
    task = build_task(config.task)
    strategy = build_strategy(config, env)
    model = prepare_model(config, env, strategy)  # before the optimizer, which steps on what it holds
    optimizer = build_optimizer(config.optim, model)
    log.info(
        "model %s (%d parameters) on %s, backend %s, world size %d, %d samples per process per step",
        config.model["_target_"], count_parameters(model), env.device, env.backend, env.world_size,
        config.data.batch_size,
    )  # fmt: skip
    # The compiled module shares the model's parameters; checkpoints keep the plain model's names.
    trained = strategy.wrap(torch.compile(model) if config.trainer.compile else model, optimizer)
    runner = StepRunner(trained, optimizer, config.trainer, env.device, env.world_size, task, strategy)
    state, generators = TrainState(), RankGenerators(config.seed, env)
    sinks = build_sinks(config.log, run_dir, env)  # what else receives the metrics (observe/sinks/)
    owners = [state, runner, *(sink for sink in sinks if hasattr(sink, "state_dict")), generators]  # generators last
    plain_config = to_plain_dict(config)
    folder = local_folder(run_dir, config.checkpoint)  # checkpoint.dir, or the run dir's checkpoints/
    checkpoints = CheckpointManager(
        folder, config.checkpoint, env, strategy, owners, plain_config, config.trainer.epochs
    )
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
        stalls=build_stall_watch(env.rank, env.world_size, config.dist.timeout_s),
        profiler=build_profiler(config.trainer, run_dir, env),
        state=state,
    )
    found = checkpoints.resume()
    if found is None:  # last, so that nothing above draws from them: each rank's own generators (dropout)
        generators.start_afresh()
    trainer.metrics.drop_after(state.step)
    trainer.sample_audit.drop_after(state.step)  # the steps a kill cut short are redone and listed again
    if env.is_main:  # rank 0 feeds the sinks; a tracker's records wait for a checkpoint to cover them
        own_checkpoint = found is None or found[0] != Path(config.checkpoint.resume)  # not another run's
        for sink in sinks:
            sink.start(state.step, trainer.metrics.path, plain_config, own_checkpoint)
            trainer.metrics.sinks.append(sink)
            if hasattr(sink, "commit"):
                checkpoints.on_written.append(sink.commit)
    return trainer

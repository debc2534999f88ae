"""What train.py and eval.py hand their config to: checks, process group, logging, errors.

User mistakes (ConfigError) end as one line on stderr and exit code 2, with no traceback,
before any process group exists where they can be found that early. Any other exception
propagates, after the process group is destroyed, so torchrun sees the failed worker.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import torch.distributed
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from .checkpoint import Checkpointer, find_compatible_checkpoint, load_checkpoint, restore
from .components import build_model, build_task, check_components
from .config import ConfigError, compose_for_checkpoint, register_configs, to_plain_dict, to_train_config
from .data import build_data
from .distributed import choose_backend, distributed, process_env
from .evaluate import evaluate
from .logs import setup_logging
from .preemption import Preempted
from .rundir import register_resolvers
from .trainer import build_trainer

log = logging.getLogger(__name__)

USER_ERROR_EXIT = 2
PREEMPTED_EXIT = 143  # 128 + SIGTERM, as a shell reports a process ended by it


def accept_legacy_local_rank(argv: list[str]) -> None:
    """Drop the `--local-rank=N` / `--local_rank N` that torch.distributed.launch appends.

    Hydra's parser rejects it; torchrun already puts the same number in LOCAL_RANK.
    """
    kept: list[str] = []
    args = iter(argv[1:])
    for arg in args:
        name, has_value, value = arg.partition("=")
        if name in ("--local-rank", "--local_rank"):
            os.environ.setdefault("LOCAL_RANK", value if has_value else next(args, "0"))
            continue
        kept.append(arg)
    argv[1:] = kept


def prepare(argv: list[str]) -> None:
    """What train.py and eval.py do before Hydra parses the command line."""
    accept_legacy_local_rank(argv)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and ("-m" in argv or "--multirun" in argv):
        fail("-m under torchrun would make every rank run the whole sweep: use bash scripts/run_single.sh -m ...")
    register_configs()
    register_resolvers()


def check_launch(cfg: DictConfig, run_dir: Path | None, local_world_size: int, visible_gpus: int) -> None:
    """What the launcher checks before torchrun starts, so that a mistake fails once, with one
    line, not in every worker and every restart: the config, the backend for this many local
    processes and GPUs, the model, data sets, optimizer and task, and the checkpoint the run dir
    would resume from. Nothing is written."""
    config = to_train_config(cfg)
    choose_backend(config.dist.backend, visible_gpus, local_world_size, torch.distributed.is_mpi_available())
    check_components(config)
    folder = (run_dir if run_dir is not None else Path("outputs") / "(new run)") / "checkpoints"
    checkpoints = Checkpointer(folder, config.checkpoint, is_writer=False)
    checkpoints.refuse_to_overwrite()
    find_compatible_checkpoint(checkpoints, to_plain_dict(config))


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(USER_ERROR_EXIT)


def reporting_user_errors(body: Callable[[], None]) -> None:
    try:
        body()
    except ConfigError as error:
        fail(str(error))
    except Preempted as stop:
        log.warning("%s; launch again with the same run dir to continue", stop)
        sys.exit(PREEMPTED_EXIT)


def run_train(cfg: DictConfig) -> None:
    """Train with the composed config (train.py's whole job)."""

    def body() -> None:
        config = to_train_config(cfg)
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        process_env(config.dist)  # an impossible backend fails here, before any process group
        with distributed(config.dist) as env:
            setup_logging(run_dir, env, config.log.all_ranks_console)
            log.info("run dir: %s", run_dir)
            result = build_trainer(config, env, run_dir).fit()
            log.info("final: %s", result.line())

    reporting_user_errors(body)


def run_eval(cfg: DictConfig) -> None:
    """Evaluate `ckpt_path` exactly, on any number of processes; print the figures on rank 0."""

    def body() -> None:
        path = Path(cfg.ckpt_path)
        if not path.is_file():
            raise ConfigError(f"ckpt_path={path}: no such file; give a checkpoints/step_<N>.pt of a run")
        try:
            payload = load_checkpoint(path)
        except Exception as error:
            raise ConfigError(f"cannot read checkpoint {path}: {error}") from None
        overrides = list(HydraConfig.get().overrides.task)
        config = to_train_config(compose_for_checkpoint(payload.get("config", {}), overrides))
        process_env(config.dist)
        with distributed(config.dist) as env:
            setup_logging(None, env, config.log.all_ranks_console)
            model = build_model(config.model)
            restore(model, payload, path)
            model.to(env.device)
            data = build_data(config.data, env, config.seed)
            result = evaluate(model, data.val_loader, build_task(config.task), env.device)
            log.info("evaluated %s (step %d) on %d processes", path, payload["step"], env.world_size)
            if env.is_main:
                print(result.line(), flush=True)

    reporting_user_errors(body)

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

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from .checkpoint import Checkpointer, find_compatible_checkpoint, load_checkpoint, restore
from .config import ConfigError, compose_for_checkpoint, register_configs, to_plain_dict, to_train_config
from .data import build_data, check_data_available
from .distributed import distributed, process_env
from .evaluate import evaluate
from .logs import setup_logging
from .models import build_model
from .preemption import Preempted
from .rundir import register_resolvers
from .trainer import build_trainer

log = logging.getLogger(__name__)

# Set by the launch scripts: validate the config and the launch, then exit before any work.
CHECK_ONLY_ENV = "DDP_CHECK_ONLY"
CHECK_GPUS_ENV = "DDP_CHECK_VISIBLE_GPUS"  # the GPUs a launch was given (GPUS=...), for that check
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
    register_configs()
    register_resolvers()
    if os.environ.get(CHECK_ONLY_ENV):
        check_composition(Path(argv[0]).resolve().parent / "configs", [a for a in argv[1:] if "hydra." not in a])


def check_composition(config_dir: Path, overrides: list[str]) -> None:
    """Compose the config as Hydra will; a mistake becomes one line saying what to change."""
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            compose(config_name="train", overrides=overrides)
    except Exception as error:  # Hydra's and OmegaConf's errors: several lines, made into one
        text = f"{error}\n{error.__cause__ or ''}"
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        detail = lines[0].removeprefix("In 'train': ")
        if any(line.startswith("Available options") for line in lines):
            listed = lines[next(i for i, line in enumerate(lines) if line.startswith("Available options")) + 1 :]
            choices = [line for line in listed if line.isidentifier() and not line.startswith("base_")]
            detail += f"; choose one of: {', '.join(choices)}"
        else:
            noise = ("full_key", "object_type", "reference_type", "Set the environment")
            detail += "".join(f": {line}" for line in lines[1:2] if not line.startswith(noise))
        fail(f"{detail} (fix that override and launch again)")


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
        if os.environ.get(CHECK_ONLY_ENV):
            gpus = os.environ.get(CHECK_GPUS_ENV)
            process_env(
                config.dist, int(gpus) if gpus else None
            )  # also refuse a run dir whose checkpoints hold another model
            check_data_available(config.data)
            checkpoints = Checkpointer(run_dir / "checkpoints", config.checkpoint, is_writer=False)
            checkpoints.refuse_to_overwrite()
            find_compatible_checkpoint(checkpoints, to_plain_dict(config))
            return
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
            model = build_model(config.model, config.data.num_classes)
            restore(model, payload, path)
            model.to(env.device)
            data = build_data(config.data, env, config.seed)
            result = evaluate(model, data.val_loader, env.device)
            log.info("evaluated %s (step %d) on %d processes", path, payload["step"], env.world_size)
            if env.is_main:
                print(result.line(), flush=True)

    reporting_user_errors(body)

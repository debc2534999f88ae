"""What train.py and eval.py hand their config to: checks, process group, logging, errors.

User mistakes (ConfigError) end as one line on stderr and exit code 2, with no traceback,
before any process group exists where they can be found that early. Any other exception
propagates, after the process group is destroyed, so torchrun sees the failed worker.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import torch.distributed
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from .checkpoint import (
    Checkpointer,
    NotACheckpoint,
    check_format_version,
    find_compatible_checkpoint,
    load_checkpoint,
    restore,
)
from .compatibility import check_same_config_everywhere
from .components import build_model, build_task, check_components
from .config import (
    ConfigError,
    JobError,
    compose_for_checkpoint,
    register_configs,
    to_plain_dict,
    to_train_config,
)
from .data import build_data
from .distributed import check_sync_batchnorm, choose_backend, distributed, process_env
from .evaluate import evaluate
from .fsdp import check_offload
from .hangs import keep_ddp_working_on_gloo
from .launch import die_with_parent
from .logs import setup_logging
from .preemption import Preempted
from .rundir import FAILED_MARKER, register_resolvers, write_hydra_record, write_marker
{%- if cookiecutter.mlflow == "yes" or cookiecutter.wandb == "yes" %}
from .trackers import check_installed as check_trackers_installed
from .trackers import check_servers as check_tracker_servers
{%- endif %}
from .trainer import build_trainer

log = logging.getLogger(__name__)

USER_ERROR_EXIT = 2


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
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a worker: it dies with its torchrun agent
        die_with_parent()
        if os.getppid() == 1:  # the agent is already gone
            sys.exit(1)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and ("-m" in argv or "--multirun" in argv):
        fail("-m under torchrun would make every rank run the whole sweep: use bash scripts/run_single.sh -m ...")
    register_configs()
    register_resolvers()


def check_launch(
    cfg: DictConfig, run_dir: Path | None, local_world_size: int, visible_gpus: int, world_size: int
) -> torch.nn.Module:
    """What the launcher checks before torchrun starts, so that a mistake fails once, with one
    line, not in every worker and every restart: the config, the backend for this many local
    processes and GPUs, the model, data sets, optimizer and task, the trackers' servers, and the
    checkpoint the run dir would resume from. Nothing is written. The model, as built."""
    config = to_train_config(cfg)
    choice = choose_backend(config.dist.backend, visible_gpus, local_world_size, torch.distributed.is_mpi_available())
    check_offload(config, choice.use_cuda)
    check_sync_batchnorm(config.ddp, choice.use_cuda, world_size)
{%- if cookiecutter.mlflow == "yes" or cookiecutter.wandb == "yes" %}
    check_trackers_installed(config.log)
    check_tracker_servers(config.log)
{%- endif %}
    model = check_components(config)
    check_room_for_checkpoints(run_dir if run_dir is not None else Path("outputs"), model)
    folder = (run_dir if run_dir is not None else Path("outputs") / "(new run)") / "checkpoints"
    checkpoints = Checkpointer(folder, config.checkpoint, is_writer=False)
    checkpoints.refuse_to_overwrite()
    find_compatible_checkpoint(checkpoints, to_plain_dict(config), config.trainer.epochs)
    return model


def check_room_for_checkpoints(run_dir: Path, model: torch.nn.Module) -> None:
    """The run dir must be writable, with room for a checkpoint and the one being written: the
    weights and up to two optimizer states each (Adam's), twice."""
    existing = next(folder for folder in (run_dir, *run_dir.resolve().parents) if folder.exists())
    if not os.access(existing, os.W_OK):
        raise ConfigError(f"{existing} is not writable, and the run dir {run_dir} must be: give another RUN_DIR")
    need = 2 * 3 * sum(tensor.numel() * tensor.element_size() for tensor in model.state_dict().values())
    free = shutil.disk_usage(existing).free
    if free < need:
        raise ConfigError(
            f"{existing} has {free / 2**20:.0f} MiB free, and checkpoints of this model need about "
            f"{need / 2**20:.0f} MiB: free some space or give a RUN_DIR on another disk"
        )


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
        sys.exit(stop.exit_code)
    except JobError as error:
        stop_job(error)


def stop_job(error: JobError) -> NoReturn:
    """An error no restart can fix: the traceback to this rank's log file, the one line and the exit
    code to FAILED_MARKER for the launcher (which stops the whole job and prints it), and exit 0 so
    that torchrun does not restart the workers."""
    message = str(error).strip().splitlines()[-1]
    message = message.split("JobError: ", 1)[-1]  # raised in a DataLoader worker: its last line is ours
    log.error("stopping: %s", message, exc_info=error, extra={"file_only": True})
    if not write_marker(Path(HydraConfig.get().runtime.output_dir), FAILED_MARKER, f"{message}\n{error.exit_code}\n"):
        print(f"error: {message}", file=sys.stderr, flush=True)  # no launcher to tell: say it here
        sys.exit(error.exit_code)
    logging.shutdown()
    os._exit(0)


def run_train(cfg: DictConfig) -> None:
    """Train with the composed config (train.py's whole job)."""

    def body() -> None:
        config = to_train_config(cfg)
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        _, _, world_size, _, choice = process_env(config.dist)  # an impossible backend fails here, before any group
        check_offload(config, choice.use_cuda)
        check_sync_batchnorm(config.ddp, choice.use_cuda, world_size)
        keep_ddp_working_on_gloo(choice.backend)  # where DEBUG=1 asked for DETAIL
        with distributed(config.dist, group_of_one=config.strategy == "fsdp") as env:
            setup_logging(run_dir, env, config.log.all_ranks_console)
            log.info("run dir: %s", run_dir)
            check_same_config_everywhere(to_plain_dict(config), env)
            if env.is_main:
                write_hydra_record(run_dir, cfg, HydraConfig.get())
            result = build_trainer(config, env, run_dir).fit()
            log.info("final: %s", result.line())

    reporting_user_errors(body)


def run_eval(cfg: DictConfig) -> None:
    """Evaluate `ckpt_path` exactly, on any number of processes; print the figures on rank 0."""

    def body() -> None:
        path = Path(cfg.ckpt_path)
        if not path.exists():
            raise ConfigError(f"ckpt_path={path}: no such file; give a checkpoints/step_<N>.pt (or step_<N>/) of a run")
        try:
            payload = load_checkpoint(path)
        except NotACheckpoint as error:
            raise ConfigError(f"ckpt_path: {error}; give a checkpoints/step_<N>.pt of a run") from None
        overrides = list(HydraConfig.get().overrides.task)
        config = to_train_config(compose_for_checkpoint(payload.get("config", {}), overrides))
        check_components(config)  # another task= or data= than the checkpoint's: one line, not a traceback
        process_env(config.dist)
        with distributed(config.dist) as env:
            setup_logging(None, env, config.log.all_ranks_console)
            model = build_model(config.model)
            if path.is_dir():  # a sharded checkpoint (strategy=fsdp): every rank reads the whole weights
                from .sharded_checkpoint import load_weights  # torch.distributed.checkpoint: slow to import

                check_format_version(path, payload)
                load_weights(path, model)
            else:
                restore(model, payload, path)
            model.to(env.device)
            data = build_data(config.data, env, config.seed)
            result = evaluate(model, data.val_loader, build_task(config.task), env.device)
            log.info("evaluated %s (step %d) on %d processes", path, payload["step"], env.world_size)
            if env.is_main:
                print(result.line(), flush=True)

    reporting_user_errors(body)

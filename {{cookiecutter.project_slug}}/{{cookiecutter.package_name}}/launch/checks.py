"""The checks before torchrun starts, in the launcher's process and without torch: the config composed as the
workers will compose it, the backend, the run dir, and whether this machine holds the processes' start; each
mistake is one line (LaunchError). The rest the workers check (engine/assembly/checks.py)."""

from __future__ import annotations

from pathlib import Path

from ..common.capacity import WORKER_START_BYTES, available_memory, check_processes_fit, too_many_for_the_cores
from ..common.errors import ConfigError, say
from ..common.placement import choose_backend, visible_gpu_count
from ..common.storage import is_remote, store_module
from .keys import LaunchError
from .plan import Launch


def describe_composition_error(error: BaseException) -> str:
    """Hydra's and OmegaConf's errors (several lines) made into one that says what to change."""
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
    return f"{detail} (fix that override and launch again)"


def compose_train_config(overrides: list[str]):  # noqa: ANN201 (a DictConfig; omegaconf imported lazily)
    """configs/train.yaml with the overrides, composed as the workers will; one line if it fails."""
    from hydra import compose, initialize_config_dir

    from ..common.run_dir import register_resolvers
    from ..config import config_dir, register_configs

    register_configs()
    register_resolvers()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return compose(config_name="train", overrides=overrides)
    except Exception as error:
        raise LaunchError(describe_composition_error(error)) from None


def checked_config(overrides: list[str], launch: Launch):  # noqa: ANN201 (a TrainConfig; imported lazily)
    """The composed config through its schema and ranges, the backend for this launch's processes and GPUs,
    and the global batch at every world size it may run at: what needs no torch."""
    from ..config import to_train_config
    from ..config.batches import split_global_batch

    cfg = compose_train_config(overrides)
    try:
        config = to_train_config(cfg)
        gpus = launch.gpus if launch.gpus is not None else visible_gpu_count()
        choose_backend(config.dist.backend, gpus, launch.nproc, mpi_available=True)  # MPI: the workers know
        if config.data.global_batch_size is not None:  # even among the processes at every NNODES=MIN:MAX
            nnodes = (launch.values.get("NNODES") or "1") if launch.mode == "multi" else "1"
            low, _, high = nnodes.partition(":")
            for nodes in range(int(low), int(high or low) + 1):
                split_global_batch(config.data.global_batch_size, config.data.micro_batch_size, nodes * launch.nproc)
    except ConfigError as error:
        raise LaunchError(str(error)) from None
    return cfg, config


def preflight(overrides: list[str], run_dir: Path | None, launch: Launch) -> Path | None:
    """What the launcher checks before torchrun, in well under a second: the config (checked_config), that a
    store the checkpoints go to answers, the run dir, and whether this machine holds that many workers' start
    (warned where they outnumber the cores). Returns the run dir."""
    cfg, config = checked_config(overrides, launch)
    if is_remote(url := config.checkpoint.dir):  # one line now, not a job that trains and then cannot save
        try:
            store_module(url, "checkpoint.dir").check_reachable(url, "checkpoint.dir")
        except ConfigError as error:
            raise LaunchError(str(error)) from None
    run_dir = resolved_run_dir(run_dir, cfg)
    on_gpus = (launch.gpus if launch.gpus is not None else visible_gpu_count()) > 0
    if refusal := check_processes_fit(launch.nproc, WORKER_START_BYTES, on_gpus, available_memory()):
        raise LaunchError(refusal)
    if warning := too_many_for_the_cores(launch.nproc, on_gpus):
        say(warning, err=True)
    return run_dir


def resolved_run_dir(run_dir: Path | None, cfg) -> Path | None:  # noqa: ANN001 (a DictConfig)
    """RUN_DIR as the workers will see it: a `${...}` in it resolved against the config (the lock and
    the workers must agree on one folder), and refused when it names a file."""
    from omegaconf import OmegaConf

    if run_dir is not None and "${" in str(run_dir):
        probe = cfg.copy()
        OmegaConf.set_struct(probe, False)
        probe.launch_run_dir = str(run_dir)
        try:
            run_dir = Path(str(probe.launch_run_dir))
        except Exception as error:
            raise LaunchError(f"RUN_DIR={run_dir}: {describe_composition_error(error)}") from None
    if run_dir is not None and run_dir.exists() and not run_dir.is_dir():
        raise LaunchError(f"RUN_DIR={run_dir} is a file, not a run dir: give a folder (a new path starts a new run)")
    return run_dir

"""The checks before torchrun starts, in the launcher's process and without torch: the config composed
as the workers will compose it, the backend, the run dir, and whether this machine holds the
processes' start; each mistake is one line (LaunchError). The rest the workers check (engine/assembly/checks.py)."""

from __future__ import annotations

from pathlib import Path

from ..common.capacity import WORKER_START_BYTES, available_memory, check_processes_fit, too_many_for_the_cores
from ..common.placement import choose_backend, visible_gpu_count
from .keys import LaunchError
from .plan import Launch
from .supervise import say


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
    """The composed config through its schema and ranges, and the backend for this launch's processes
    and GPUs: what needs no torch. What does (the model, data sets, checkpoint, strategy, memory) the
    workers check as they start, before their process group forms (engine/assembly/checks.py)."""
    from ..common.errors import ConfigError
    from ..config import to_train_config

    cfg = compose_train_config(overrides)
    try:
        config = to_train_config(cfg)
        gpus = launch.gpus if launch.gpus is not None else visible_gpu_count()
        choose_backend(config.dist.backend, gpus, launch.nproc, mpi_available=True)  # MPI: the workers know
        check_global_batch(config, launch)
    except ConfigError as error:
        raise LaunchError(str(error)) from None
    return cfg, config


def check_global_batch(config, launch: Launch) -> None:  # noqa: ANN001 (a TrainConfig)
    """data.global_batch_size must split evenly among the job's processes, at every world size it may run
    at (NNODES=MIN:MAX: each number of nodes): one line now, not a refusal in every worker."""
    from ..config.batches import split_global_batch

    if config.data.global_batch_size is None:
        return
    low, _, high = (launch.values.get("NNODES") or "1").partition(":") if launch.mode == "multi" else ("1", "", "")
    for nodes in range(int(low), int(high or low) + 1):
        split_global_batch(config.data.global_batch_size, config.data.micro_batch_size, nodes * launch.nproc)


def preflight(overrides: list[str], run_dir: Path | None, launch: Launch) -> Path | None:
    """What the launcher checks before torchrun, in well under a second: the config as the workers
    will compose it, the backend for this launch's processes and GPUs, the run dir (its `${...}`
    resolved as the workers would), and whether this machine holds that many workers' start
    (warned where they outnumber the cores), and that a store the checkpoints go to answers.
    Returns the run dir."""
    cfg, config = checked_config(overrides, launch)
    check_store(config.checkpoint.dir)
    run_dir = resolved_run_dir(run_dir, cfg)
    on_gpus = (launch.gpus if launch.gpus is not None else visible_gpu_count()) > 0
    if refusal := check_processes_fit(launch.nproc, WORKER_START_BYTES, on_gpus, available_memory()):
        raise LaunchError(refusal)
    if warning := too_many_for_the_cores(launch.nproc, on_gpus):
        say(warning, err=True)
    return run_dir


def check_store(url: str) -> None:
    """A checkpoint.dir that is a URL: one line now where it names no store this project reaches, or one that
    does not answer, not a job that trains and then cannot save."""
    from ..common.errors import ConfigError
    from ..common.storage import is_remote, store_module

    if is_remote(url):
        try:
            store_module(url, "checkpoint.dir").check_reachable(url, "checkpoint.dir")
        except ConfigError as error:
            raise LaunchError(str(error)) from None


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

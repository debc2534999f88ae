"""What train.py, eval.py and predict.py hand their config to: checks, process group, logging, errors.

A ConfigError ends as one line, exit code 2 (under the launcher through its control dir: it stops the job
and says it once); a JobError stops the job once too; any other exception propagates, so torchrun sees it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.distributed.elastic.multiprocessing import errors

from ...common.errors import USER_ERROR_EXIT, ConfigError, JobError, Preempted, fail
from ...common.placement import DistEnv
from ...common.processes import die_with_parent
from ...common.run_dir import (
    CONTROL_DIR_ENV,
    FAILED_MARKER,
    REFUSED,
    read_marker,
    register_resolvers,
    write_hydra_record,
    write_marker,
)
from ...common.storage import local_path
from ...config import TrainConfig, compose_for_checkpoint, register_configs, to_plain_dict, to_train_config
from ...observe.logs import setup_logging
from ..checkpoint.files import NotACheckpoint, best_checkpoint, load_checkpoint, shards_reader
from ..checkpoint.trust import check_data_paths, check_trusted, command_values, saved_config
from ..checkpoint.weights import has_ema, load_weights
from ..data.loader import build_data
from ..distributed.process_group import distributed, keep_ddp_working_on_gloo, process_env, tell_the_other_nodes
from ..evaluate import evaluate
from ..strategies import strategy_class
from .build import build_trainer
from .checks import check_components, check_launch
from .compatibility import check_same_config_everywhere
from .components import build_model, build_task, import_targets, run_records

log = logging.getLogger(__name__)
LAUNCHER_SWEEP = f"{__package__.split('.')[0]}.launch.sweep"  # -m of the launcher, where the project has it


def accept_legacy_local_rank(argv: list[str]) -> None:
    """Drop the `--local-rank=N` / `--local_rank N` that torch.distributed.launch appends (Hydra rejects it)."""
    kept: list[str] = []
    args = iter(argv[1:])
    for arg in args:
        name, has_value, value = arg.partition("=")
        if name in ("--local-rank", "--local_rank"):  # torchrun puts the same number in LOCAL_RANK
            os.environ.setdefault("LOCAL_RANK", value if has_value else next(args, "0"))
        else:
            kept.append(arg)
    argv[1:] = kept


def prepare(argv: list[str]) -> None:
    """What train.py, eval.py and predict.py do before Hydra parses the command line."""
    accept_legacy_local_rank(argv)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a worker: it dies with its torchrun agent
        die_with_parent()
        # Until the trainer's handlers (engine/preemption.py), a stop signal ends the worker at once, SIGINT as
        # SIGTERM and SIGHUP do, not as a KeyboardInterrupt's traceback amid the config's composition or the build.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if os.getppid() == 1:  # the agent is already gone
            sys.exit(1)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and ("-m" in argv or "--multirun" in argv):
        has_sweeps = importlib.util.find_spec(LAUNCHER_SWEEP) is not None
        how = "use bash scripts/run_single.sh -m ..." if has_sweeps else "give torchrun one config at a time"
        fail(f"-m under torchrun would make every rank run the whole sweep: {how}")
    register_configs()
    register_resolvers()


class WholeErrorFile(errors.ErrorHandler):
    """torchrun's error handler, whose error file is whole or absent: the agent reads the files of the ranks it
    SIGTERMs after a failure too, and a cut one killed it with a JSONDecodeError (torch 2.14)."""

    def record_exception(self, e: BaseException) -> None:
        file = self._get_error_file_path()
        if not file:
            return
        extra = {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))}
        message = {"message": f"{type(e).__name__}: {e}", "extraInfo": extra}  # torch's format
        partial = f"{file}.partial"
        with open(partial, "w") as out:
            json.dump({"message": message}, out)
        os.replace(partial, file)


def record(main: Callable[..., None]) -> Callable[..., None]:
    """torchrun's @record (its failure summary names the rank), the error file written whole or not at all."""
    return errors.record(main, error_handler=WholeErrorFile())


def reporting_user_errors(body: Callable[[], None]) -> None:
    try:
        body()
    except ConfigError as error:
        refuse(error)
    except Preempted as stop:
        log.warning("%s; launch again with the same run dir to continue", stop)
        sys.exit(stop.exit_code)
    except JobError as error:
        stop_job(error)
    except Exception:
        if os.environ.get(CONTROL_DIR_ENV) and read_marker(None, FAILED_MARKER) is not None:
            # Another rank stopped the job (its line is in this launch's control dir): this error echoes it.
            os._exit(0)
        raise


def refuse(error: ConfigError, tell: bool = True) -> NoReturn:
    """A user's mistake: its line to the launcher and (`tell`) the other nodes; without a launcher, said here."""
    said = f"{error}\n{USER_ERROR_EXIT}\n{REFUSED}\n"
    if os.environ.get(CONTROL_DIR_ENV) and tell:
        tell_the_other_nodes(str(error))
    if os.environ.get(CONTROL_DIR_ENV) and write_marker(None, FAILED_MARKER, said):
        logging.shutdown()
        os._exit(0)  # no restart: torchrun sees a worker that ended well, the launcher stops the others
    fail(str(error))


def stop_job(error: JobError) -> NoReturn:
    """An error no restart can fix: its line and exit code to the launcher, exit 0 so torchrun restarts nothing."""
    message = str(error).strip().splitlines()[-1].split("JobError: ", 1)[-1]  # a DataLoader worker's: its last line
    log.error("stopping: %s", message, exc_info=error, extra={"file_only": True})
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if not write_marker(run_dir, FAILED_MARKER, f"{message}\n{error.exit_code}\n"):
        print(f"error: {message}", file=sys.stderr, flush=True)  # no launcher to tell: say it here
        sys.exit(error.exit_code)
    logging.shutdown()
    os._exit(0)


def run_train(cfg: DictConfig) -> None:
    """Train with the composed config (train.py's whole job)."""

    def body() -> None:
        config = to_train_config(cfg)
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        rank, local_rank, world_size, local_world_size, choice = process_env(config.dist)  # a backend that cannot work
        plain = to_plain_dict(config)  # what the checks and the other ranks compare (built once: it is slow)
        built = None  # what the checks built and read: the trainer takes it (each component built once)
        if local_rank == 0 or not os.environ.get(CONTROL_DIR_ENV):  # under the launcher: once a node
            stand_in = DistEnv(rank, local_rank, world_size, local_world_size, choice.backend, None)  # type: ignore[arg-type]
            built = check_launch(config, run_dir, stand_in, choice, plain)
        else:  # while this node's local rank 0 checks: its imports, not after the group formed
            import_targets([config.model, config.data.dataset, config.task, config.optim, config.data.collate])
        keep_ddp_working_on_gloo(choice.backend)  # where DEBUG=1 asked for DETAIL
        on_refused = (lambda line: refuse(ConfigError(line), tell=False)) if os.environ.get(CONTROL_DIR_ENV) else None
        with distributed(config.dist, strategy_class(config.strategy).needs_group_of_one, on_refused) as env:
            setup_logging(run_dir, env, config.log.all_ranks_console)
            log.info("run dir: %s", run_dir)
            check_same_config_everywhere(plain, env)
            if env.is_main:
                write_hydra_record(run_dir, cfg, HydraConfig.get())
            result = build_trainer(config, env, run_dir, built).fit()
            log.info("final: %s", result.line())

    reporting_user_errors(body)


def checkpoint_config(
    cfg: DictConfig, config_name: str, components: bool = True
) -> tuple[Path, dict[str, Any], TrainConfig]:
    """The checkpoint `ckpt_path` names (`best`: keep_best's), its config checked by the trust rule and composed
    with the user's overrides on `config_name`'s yaml; with `components`, checked whole, the data set's paths too."""
    if OmegaConf.is_missing(cfg, "ckpt_path"):
        raise ConfigError("ckpt_path is required: give ckpt_path=<run>/checkpoints/step_<N>.pt (or step_<N>/, best)")
    path = Path(local_path(str(cfg.ckpt_path), "ckpt_path"))
    if path.name == "best":  # checkpoint.keep_best's best one
        path = best_checkpoint(path)
    if not path.exists():
        raise ConfigError(f"ckpt_path={path}: no such file; give a checkpoints/step_<N>.pt (or step_<N>/) of a run")
    if path.is_dir():  # a folder of shards: one line where this project cannot read them, before its config's
        shards_reader(path)
    try:
        payload = load_checkpoint(path)
    except NotACheckpoint as error:
        raise ConfigError(f"ckpt_path: {error}; give a checkpoints/step_<N>.pt of a run") from None
    saved = saved_config(payload)
    overrides = list(HydraConfig.get().overrides.task)
    given = {item.split("=", 1)[0].lstrip("+~") for item in overrides}  # what the command gives is not saved's
    trust = bool(cfg.get("trust_checkpoint"))  # the user's, not saved's
    check_trusted(saved, trust, "trust_checkpoint=true", given)
    config = to_train_config(compose_for_checkpoint(saved, overrides, config_name))
    if components:
        if not trust:  # the data set is built: what it reads, writes or fetches is the command's to say
            check_data_paths(config.data.node, command_values(overrides), given, "trust_checkpoint=true")
        check_components(config)  # another task= or data= than the checkpoint's: one line, not a traceback
    return path, payload, config


def checkpoint_model(path: Path, payload: dict[str, Any], config: TrainConfig, device: torch.device) -> nn.Module:
    """The checkpoint's model on `device`, with its whole weights (the EMA's where the run kept one)."""
    model = build_model(config.model)
    load_weights(path, model, payload)
    if has_ema(path, payload):
        log.info("evaluating the EMA of the weights (trainer.ema), as the run's validation did")
    return model.to(device)


def run_eval(cfg: DictConfig) -> None:
    """Evaluate `ckpt_path` exactly, on any number of processes; print the figures on rank 0."""

    def body() -> None:
        path, payload, config = checkpoint_config(cfg, "eval")
        process_env(config.dist)
        with distributed(config.dist) as env:
            setup_logging(None, env, config.log.all_ranks_console)
            model = checkpoint_model(path, payload, config, env.device)
            data = build_data(config.data, env, config.seed)
            result = evaluate(model, data.val_loader, build_task(config.task), env.device)
            said = "".join(f"; {module.describe(payload)}" for module in run_records())  # the run's record
            log.info("evaluated %s (step %d) on %d processes%s", path, payload["step"], env.world_size, said)
            if (why := result.uncounted()) and env.is_main:  # a NaN figure: say why beside it
                log.warning(why)
            if env.is_main:
                print(result.line(), flush=True)

    reporting_user_errors(body)

"""What a worker checks as it starts, before the process group forms, so that a mistake fails once, in one
line (docs/troubleshooting.md, "Before any work"): under the launcher each node's local rank 0, without it
every rank (entry.py). Nothing is written.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch.utils.data import default_collate

from ...common.capacity import available_memory, check_processes_fit, peak_rss
from ...common.errors import ConfigError, JobError, first_line
from ...common.placement import BackendChoice, DistEnv
from ...common.run_dir import OUTPUT_ROOT
from ...config import TrainConfig, to_plain_dict
from ...config.batches import apply_global_batch
from ...datasets.collate import model_forward
from ...datasets.randomness import building_sample
from ...observe.sinks import check_sinks
from ..checkpoint.files import local_folder
from ..checkpoint.manager import check_resume
from ..checkpoint.writer import Checkpointer
from ..data.loader import build_collate, check_datasets
from ..strategies import build_strategy
from .components import build_datasets, build_model, build_optimizer, build_task, describe


@dataclass
class Built:
    """What the checks built and read, handed to the trainer (build.py) so that each is built or read once.
    Not the data sets: what a first read opens (a file handle, an S3 client's event loop) is not for the
    DataLoader workers forked later."""

    model: torch.nn.Module  # freshly initialised from the seed, on the CPU
    task: Any
    resume: tuple[Path, dict[str, Any]] | None = None  # the checkpoint found (None: none)


def check_launch(
    config: TrainConfig, run_dir: Path | None, env: DistEnv, choice: BackendChoice, plain: dict[str, Any] | None = None
) -> Built:
    """Every check for a job of `env`'s shape; what they built and read. `plain`: to_plain_dict(config), if at hand."""
    apply_global_batch(config, env.world_size)  # a global batch this world size does not divide: one line
    build_strategy(config, env).check(choice.use_cuda)
    check_sinks(config.log)
    built = check_components(config)
    check_memory(env, choice.use_cuda, weight_bytes(built.model))
    check_room_for_checkpoints(run_dir if run_dir is not None else Path(OUTPUT_ROOT), built.model)
    folder = local_folder(run_dir if run_dir is not None else Path(OUTPUT_ROOT) / "(new run)", config.checkpoint)
    checkpoints = Checkpointer(folder, config.checkpoint, is_writer=False, fetches=True)
    checkpoints.check_owner(run_dir)  # checkpoint.dir: another run's is refused (writer.py)
    checkpoints.refuse_to_overwrite()
    built.resume = checkpoints.find_resume_payload()
    check_resume(built.resume, plain or to_plain_dict(config), config.trainer.epochs)
    return built


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in model.state_dict().values())


def check_memory(env: DistEnv, on_gpus: bool, weights: int) -> None:
    """This node's processes must fit in its memory: each this one's peak, plus gradients and two optimizer states."""
    per_process = peak_rss() + 3 * weights
    measured = "the first worker's model and batch took"
    if refusal := check_processes_fit(env.local_world_size, per_process, on_gpus, available_memory(), measured):
        raise ConfigError(refusal)


def check_room_for_checkpoints(run_dir: Path, model: torch.nn.Module) -> None:
    """The run dir must be writable, with room for two checkpoints (the weights and two optimizer states each)."""
    existing = next(folder for folder in (run_dir, *run_dir.resolve().parents) if folder.exists())
    if not os.access(existing, os.W_OK):
        raise ConfigError(f"{existing} is not writable, and the run dir {run_dir} must be: give another RUN_DIR")
    need = 2 * 3 * weight_bytes(model)
    free = shutil.disk_usage(existing).free
    if free < need:
        raise ConfigError(
            f"{existing} has {free / 2**20:.0f} MiB free, and checkpoints of this model need about "
            f"{need / 2**20:.0f} MiB: free some space or give a RUN_DIR on another disk"
        )


def check_components(config: TrainConfig) -> Built:
    """Build everything and run one batch through the model and the task: a mistake is one line, not one per rank."""
    train, val = build_datasets(config.data.dataset)
    check_datasets(config.data, (train, val))
    torch.manual_seed(config.seed)  # the weights build.py would initialise (nothing before it draws)
    model = build_model(config.model)
    build_optimizer(config.optim, model)
    task = build_task(config.task)
    collate = build_collate(config.data)
    try:
        items = []
        for index in (0, len(cast(Sized, train)) - 1):  # map-style: build_datasets checks
            with building_sample(0, 0, index):
                items.append(train[index])
            if not (isinstance(items[-1], tuple | list) and len(items[-1]) == 2):
                raise TypeError(f"item {index} is {describe(items[-1])}")
        inputs, targets = default_collate(items) if collate is None else collate.pairs(items)
    except JobError as error:  # the user's data.collate failed: its own line
        raise ConfigError(str(error)) from None
    except Exception as error:
        raise ConfigError(
            f"data.dataset: cannot batch its items ({first_line(error)}): items must be (input, target) "
            "pairs whose tensors stack, or give data.collate (docs/configuration.md)"
        ) from None
    try:
        with torch.no_grad():
            model.eval()
            outputs = model_forward(model, inputs)
            loss = task.loss(outputs, targets)
            metrics = task.metrics(outputs, targets)
        model.train()  # as built: the trainer takes it on
    except Exception as error:
        raise ConfigError(
            f"model, data and task do not fit together: one batch fails with {first_line(error)}; "
            "check model=, data= and task= (and data.num_classes)"
        ) from None
    target = f"task._target_={config.task['_target_']}"
    if isinstance(loss, tuple):  # (total, count): the items' summed loss and their number
        total, count = loss if len(loss) == 2 else (None, None)
        if not (isinstance(total, torch.Tensor) and total.dim() == 0):
            raise ConfigError(
                f"{target}: loss() returned a tuple of {len(loss)}: a pair must be "
                "(total, count), the loss summed over the batch's items as a 0-d tensor and their number"
            )
        check_count(count, f"{target}: loss()")
    elif not (isinstance(loss, torch.Tensor) and loss.shape == (len(items),)):
        raise ConfigError(
            f"{target}: loss() must return one value per sample, "
            f"shape ({len(items)},), or a pair (total, count), got {tuple(getattr(loss, 'shape', ()))}"
        )
    for name, value in metrics.items():  # a pair's count of another shape fails the validation's first batch
        if isinstance(value, tuple) and len(value) == 2:
            check_count(value[1], f"{target}: metrics()['{name}']")
    return Built(model, task)


def check_count(count: Any, said: str) -> None:
    """A pair's count is summed with the other batches' into one number: a tensor of shape (1,) fails mid-run."""
    if isinstance(count, torch.Tensor) and count.dim() != 0:
        raise ConfigError(
            f"{said} returned a count of shape {tuple(count.shape)}: a pair's count must be a scalar, a 0-d tensor "
            "(e.g. mask.sum()) or a plain number"
        )
    if not isinstance(count, torch.Tensor | int | float):
        raise ConfigError(f"{said} returned a count of type {type(count).__name__}: a pair's count must be a scalar, "
                          "a 0-d tensor (e.g. mask.sum()) or a plain number")  # fmt: skip

"""A checkpoint's model over a data set, its outputs to one file, on any number of processes:
`python -m {{ cookiecutter.package_name }}.predict ckpt_path=... out=FILE.pt [split=val|train] [predict_as=...]`,
`torchrun -m {{ cookiecutter.package_name }}.predict ...`, or `{{ cookiecutter.package_name }}-predict ...` once installed.

OUT holds `{"indices": (N,), "outputs": (N, ...)}` (tensors only, in sample order), the same bit for bit at any
world size: each rank runs whole batches of a one-process run. The file and its promises: docs/checkpoints.md.
"""

from __future__ import annotations

import glob
import logging
import os
import sys
from pathlib import Path
from typing import Any, cast

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader, Subset

from .common.errors import ConfigError
from .common.placement import DistEnv
from .common.processes import exit_now
from .common.storage import is_remote
from .config import PredictConfig, config_dir, let_group_keys_through
from .config.values import require
from .datasets.collate import model_forward, to_device
from .engine.assembly.components import build_task
from .engine.assembly.entry import checkpoint_config, checkpoint_model, prepare, record, reporting_user_errors
from .engine.checkpoint.files import TMP_PREFIX, write_atomically
from .engine.data.loader import KeyedDataset, build_datasets, loader_options
from .engine.distributed.process_group import (
    all_gather_bytes,
    all_gather_int,
    all_gather_tensors,
    distributed,
    process_env,
)
from .observe.logs import setup_logging
from .tasks import IGNORE, Task

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="predict")
@record
def predict_checkpoint(cfg: DictConfig) -> None:
    run_predict(cfg)


def main() -> None:
    """The process's entry (console script, `python -m`, predict.py beside the package)."""
    prepare(sys.argv)
    let_group_keys_through(sys.argv)  # data.val_size=5 goes to the checkpoint's data group
    predict_checkpoint()
    exit_now(0)  # written: no seconds of interpreter teardown


def run_predict(cfg: DictConfig) -> None:
    """Write `ckpt_path`'s model's outputs over `split` to `out`; a mistake is one line, before any work."""

    def body() -> None:
        out = output_path(cfg)
        path, payload, composed = checkpoint_config(cfg, "predict")
        config = cast(PredictConfig, composed)  # composed on predict.yaml, whose schema PredictConfig is
        prediction_kind(build_task(config.task), config)  # a predict_as the task has not: before any work
        process_env(config.dist)
        with distributed(config.dist) as env:
            setup_logging(None, env, config.log.all_ranks_console)
            write_predictions(checkpoint_model(path, payload, config, env.device), config, env, out)
            log.info("predicted %s (step %d) on %d processes", path, payload["step"], env.world_size)

    reporting_user_errors(body)


def output_path(cfg: DictConfig) -> Path:
    """`out` as given, refused in one line where it is missing, exists (nothing is overwritten) or names a store."""
    if OmegaConf.is_missing(cfg, "out"):
        raise ConfigError("out is required: give out=FILE.pt, the file to write the predictions to")
    given = str(cfg.out)
    if is_remote(given):
        raise ConfigError(f"out={given}: predictions are written to this machine's disk: give a local path")
    out = Path(given)
    if out.exists():
        raise ConfigError(f"out={out} exists: give another output path (nothing is overwritten)")
    return out


def write_predictions(model: nn.Module, config: PredictConfig, env: DistEnv, out: Path) -> None:
    """The model's outputs over the configured split, gathered from every rank; rank 0 writes `out` (checked
    writable before the first batch), with `lengths` (N,) where outputs of different lengths were padded."""
    refuse_on_every_rank(writable(out) if env.is_main else "", env)
    task = build_task(config.task)
    kind = prediction_kind(task, config)
    train, val = build_datasets(config.data.dataset)
    dataset = KeyedDataset(train if config.split == "train" else val, config.seed)
    shard = batch_shard(len(dataset), config.data.batch_size, env.rank, env.world_size)
    loader = DataLoader(Subset(dataset, list(shard)), shuffle=False, **loader_options(config.data, env, config.seed))
    piece, refused = {}, ""
    try:
        indices, outputs, lengths = predict(model, loader, task, kind, env.device)
        piece = {"indices": indices, "outputs": outputs, "lengths": lengths}
    except ConfigError as error:  # said by every rank, also one with no batch, which would wait in the gather
        refused = str(error)
    refuse_on_every_rank(refused, env)
    pieces = all_gather_tensors(piece, env.device, keep=env.is_main)
    if env.is_main:
        whole = [piece for piece in pieces if len(piece["indices"])]  # a rank with no batch sends nothing
        # The shards are contiguous and in rank order: the samples are in index order.
        indices = torch.cat([piece["indices"] for piece in whole])
        outputs, lengths = joined([piece["outputs"] for piece in whole], [piece["lengths"] for piece in whole])
        written = {"indices": indices, "outputs": outputs}
        if lengths is not None and bool((lengths < outputs.shape[1]).any()):  # (no padding: the file as ever)
            written["lengths"] = lengths
        write_atomically(written, out)
        log.info("wrote %s: the %s set's %d samples, outputs %s", out, config.split, len(indices), tuple(outputs.shape))


def refuse_on_every_rank(refused: str, env: DistEnv) -> None:
    """A refusal of any rank raised on every rank, rank 0's first (a rank with no batch would wait in a gather)."""
    if any(all_gather_int(len(refused), env.device)):  # (no gather of nothing but empty pieces)
        said = [text for text in all_gather_bytes(refused.encode(), env.device) if text]
        raise ConfigError(said[0].decode())


def writable(out: Path) -> str:
    """Why `out` cannot be written ('' where it can): its folder made and a file tried in it, after removing the
    temporaries of killed predicts to `out` (a live process's may be another predict's, still writing; one on
    another machine is not seen: its predict fails at its rename)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        for stale in out.parent.glob(f"{TMP_PREFIX}{glob.escape(out.name)}.*"):
            pid = stale.name.rsplit(".", 1)[1]
            if pid.isdigit() and not alive(int(pid)):
                stale.unlink(missing_ok=True)
                log.info("removed %s, the temporary file of a predict that was stopped", stale)
        probe = out.with_name(f"{TMP_PREFIX}{out.name}.{os.getpid()}")  # write_atomically's name for its own
        probe.touch()
        probe.unlink()
    except OSError as error:  # (mkdir says "File exists" of a file in the way of a folder)
        why = f"{error.filename} is not a folder" if isinstance(error, FileExistsError) else error.strerror
        return f"out={out} cannot be written ({why}): give a path in a folder you can write to"
    return ""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def prediction_kind(task: Task, config: PredictConfig) -> str | None:
    """What the task turns outputs into (its `predict` and `predictions`); None: the outputs as they are."""
    predict_as, target = config.predict_as, config.task["_target_"]
    kinds = tuple(getattr(task, "predictions", ()))
    if not (kinds and callable(getattr(task, "predict", None))):
        require(
            predict_as is None,
            f"predict_as={predict_as}: task._target_={target} has no predict method and predictions "
            "(tasks/__init__.py), so the model's outputs are saved as they are: drop predict_as",
        )
        return None
    require(
        predict_as in (None, *kinds),
        f"predict_as={predict_as}: task._target_={target} saves one of {', '.join(kinds)}: give one of them",
    )
    return predict_as or kinds[0]


def batch_shard(size: int, batch_size: int, rank: int, world_size: int) -> range:
    """This rank's contiguous share of whole batches of a one-process run: no padding, no sample twice."""
    batches = -(-size // batch_size)
    first, last = batches * rank // world_size, batches * (rank + 1) // world_size
    return range(first * batch_size, min(last * batch_size, size))


@torch.no_grad()
def predict(
    model: nn.Module, loader: DataLoader, task: Task, kind: str | None, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """This rank's sample indices, what the task makes of their outputs (on the host) and their lengths (joined's)."""
    model.eval()
    indices, outputs, lengths = [], [], []
    for inputs, targets, _, batch_indices in loader:
        result = model_forward(model, to_device(inputs, device))
        result = cast(Any, task).predict(result, kind) if kind is not None else result  # a kind: it has predict
        if not isinstance(result, torch.Tensor):
            raise ConfigError(
                f"the model's outputs are {type(result).__name__}, not a tensor: give the task a predict method "
                "that makes one of them (tasks/__init__.py)"
            )
        result, length = masked(result.cpu(), targets)
        indices.append(batch_indices)
        outputs.append(result)
        lengths.append(length)
    if not indices:
        return torch.zeros(0, dtype=torch.int64), None, None
    return torch.cat(indices), *joined(outputs, lengths)


def masked(result: torch.Tensor, targets: object) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A batch's outputs and each sample's length along dimension 1 (None for one dimension): up to the last
    position its targets do not mark IGNORE (pad_windows), the rest filled, else the batch's length."""
    if result.dim() < 2:
        return result, None
    lengths = torch.full((len(result),), result.shape[1], dtype=torch.int64)
    if isinstance(targets, torch.Tensor) and targets.shape == result.shape[:2] and not targets.is_floating_point():
        positions = torch.arange(1, result.shape[1] + 1)
        lengths = (positions * (targets.cpu() != IGNORE)).amax(dim=1)
        beyond = positions[None, :] > lengths[:, None]
        if beyond.any():
            result = result.clone()
            result[beyond] = fill_value(result)
    return result, lengths


def joined(outputs: list[torch.Tensor], lengths: list[torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Outputs concatenated, padded along dimension 1 to the longest with fill_value, and the samples' lengths (None
    for one dimension). Padded so at each rank, then again on rank 0: the same file."""
    if any(length is None for length in lengths):
        return torch.cat(outputs), None
    longest = max(output.shape[1] for output in outputs)
    padded = [
        torch.cat([output, output.new_full((len(output), longest - output.shape[1], *output.shape[2:]),
                                           fill_value(output))], dim=1)
        for output in outputs
    ]  # fmt: skip
    return torch.cat(padded), torch.cat(lengths)  # type: ignore[arg-type]


def fill_value(output: torch.Tensor) -> float | int:
    """What pads a position that is no sample's: NaN for floats, IGNORE for integers (ids, classes)."""
    return float("nan") if output.is_floating_point() else IGNORE


if __name__ == "__main__":
    main()

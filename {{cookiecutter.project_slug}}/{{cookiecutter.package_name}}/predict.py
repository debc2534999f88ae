"""A checkpoint's model over a data set, its outputs to one file, on any number of processes:
`python -m {{ cookiecutter.package_name }}.predict ckpt_path=... out=FILE.pt [split=val|train] [predict_as=...]`,
`torchrun -m {{ cookiecutter.package_name }}.predict ...`, or `{{ cookiecutter.package_name }}-predict ...` once installed.

OUT holds `{"indices": (N,), "outputs": (N, ...)}`, tensors only, ordered by sample index, each sample
once: `torch.load(OUT, weights_only=True)`. Each rank runs whole batches of the set (the batches of a
one-process run, so each sample's output is computed in the same batch at any world size: the file is
the same, bit for bit); the ranks gather the pieces and rank 0 writes the file.
"""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path
from typing import Any

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
from .engine.assembly.components import build_datasets, build_task
from .engine.assembly.entry import checkpoint_config, checkpoint_model, prepare, record, reporting_user_errors
from .engine.checkpoint.files import write_atomically
from .engine.data.loader import KeyedDataset, loader_options
from .engine.distributed.process_group import all_gather_bytes, all_gather_int, distributed, process_env
from .observe.logs import setup_logging
from .tasks import Task

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
        path, payload, config = checkpoint_config(cfg, "predict")
        prediction_kind(build_task(config.task), config)  # a predict_as the task has not: before any work
        process_env(config.dist)
        with distributed(config.dist) as env:
            setup_logging(None, env, config.log.all_ranks_console)
            write_predictions(checkpoint_model(path, payload, config, env.device), config, env, out)  # type: ignore[arg-type]
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
    """The model's outputs over the configured split, gathered from every rank; rank 0 writes `out`."""
    task = build_task(config.task)
    kind = prediction_kind(task, config)
    train, val = build_datasets(config.data.dataset)
    dataset = KeyedDataset(train if config.split == "train" else val, config.seed)
    shard = batch_shard(len(dataset), config.data.batch_size, env.rank, env.world_size)
    loader = DataLoader(Subset(dataset, list(shard)), shuffle=False, **loader_options(config.data, env, config.seed))
    piece, refused = {}, ""
    try:
        indices, outputs = predict(model, loader, task, kind, env.device)
        piece = {"indices": indices, "outputs": outputs}
    except ConfigError as error:  # said by every rank, also one with no batch, which would wait in the gather
        refused = str(error)
    if any(all_gather_int(len(refused), env.device)):  # (no gather of nothing but empty pieces)
        said = [text for text in all_gather_bytes(refused.encode(), env.device) if text]
        raise ConfigError(said[0].decode())
    pieces = all_gather_bytes(to_bytes(piece), env.device)
    if env.is_main:
        whole = [torch.load(io.BytesIO(piece), weights_only=True) for piece in pieces]
        whole = [piece for piece in whole if len(piece["indices"])]  # a rank with no batch sends nothing
        # The shards are contiguous and in rank order: joined so, the samples are in index order.
        indices, outputs = (torch.cat([piece[key] for piece in whole]) for key in ("indices", "outputs"))
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomically({"indices": indices, "outputs": outputs}, out)
        log.info("wrote %s: the %s set's %d samples, outputs %s", out, config.split, len(indices), tuple(outputs.shape))


def prediction_kind(task: Task, config: PredictConfig) -> str | None:
    """What the task turns outputs into (tasks.py: its `predict` and `predictions`); None: the outputs as they are."""
    predict_as, target = config.predict_as, config.task["_target_"]
    kinds = tuple(getattr(task, "predictions", ()))
    if not (kinds and callable(getattr(task, "predict", None))):
        require(
            predict_as is None,
            f"predict_as={predict_as}: task._target_={target} has no predict method and predictions (tasks.py), "
            "so the model's outputs are saved as they are: drop predict_as",
        )
        return None
    require(
        predict_as in (None, *kinds),
        f"predict_as={predict_as}: task._target_={target} saves one of {', '.join(kinds)}: give one of them",
    )
    return predict_as or kinds[0]


def batch_shard(size: int, batch_size: int, rank: int, world_size: int) -> range:
    """This rank's contiguous share of whole batches of a one-process run: no padding, no sample twice,
    every sample computed in the same batch at any world size."""
    batches = -(-size // batch_size)
    first, last = batches * rank // world_size, batches * (rank + 1) // world_size
    return range(first * batch_size, min(last * batch_size, size))


@torch.no_grad()
def predict(
    model: nn.Module, loader: DataLoader, task: Task, kind: str | None, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This rank's sample indices and what the task makes of their outputs (on the host), in loader order."""
    model.eval()
    indices, outputs = [], []
    for inputs, _, _, batch_indices in loader:
        result = model_forward(model, to_device(inputs, device))
        result = task.predict(result, kind) if kind is not None else result
        if not isinstance(result, torch.Tensor):
            raise ConfigError(
                f"the model's outputs are {type(result).__name__}, not a tensor: give the task a predict method "
                "that makes one of them (tasks.py)"
            )
        indices.append(batch_indices)
        outputs.append(result.cpu())
    return torch.cat(indices) if indices else torch.zeros(0, dtype=torch.int64), torch.cat(outputs) if outputs else None


def to_bytes(value: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


if __name__ == "__main__":
    main()

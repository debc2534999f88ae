"""The samples behind a NaN: which step's loss or gradient went non-finite first, on which ranks, for which
samples and in which parameter; and trainer.skip_samples, which leaves such samples out (docs/troubleshooting.md).
Nothing is read back per step: the log line's read-back says whether the run diverged (the trainer's own check),
and only then are the ranks' findings gathered. The trainer finds this module by its `divergence_watch`.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..common.errors import ConfigError, JobError
from ..common.placement import DistEnv
from .distributed.dtensors import local
from .distributed.process_group import all_gather_bytes, all_gather_int

log = logging.getLogger(__name__)

NONFINITE_FILE = "nonfinite.jsonl"
SHOWN = 16  # sample indices named in the error line (the file holds all)


def first_nonfinite(grads: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The position in `grads` of the first gradient whose norm is not finite, -1 where none; on the device, one
    foreach call. The 2-norm: the max-norm takes a slow path on the CPU (7 ms a step for small_cnn's)."""
    norms = [norm.to(device, non_blocking=True) for norm in torch._foreach_norm(list(grads))]
    finite = torch.stack(norms).isfinite()
    return torch.where(finite.all(), -1, (~finite).to(torch.int32).argmax()).to(torch.int64)


class NonFiniteWatch:
    """This rank's record of the steps since the last log line: on the device, how many went by before the loss
    (this rank's) and the gradient (global) turned non-finite, and which gradient first did; on the host, their
    samples and which parameters had gradients. `grads_watched`: off under fp16, whose GradScaler skips such
    steps as a matter of course."""

    def __init__(self, device: torch.device, steps_kept: int, grads_watched: bool) -> None:
        self.enabled, self.grads_watched, self.device = True, grads_watched, device  # enabled: off keeps none of this
        self.finite_steps = torch.zeros(2, dtype=torch.int64, device=device)  # before the loss's, the gradient's
        self.bad_parameter = torch.full((), -1, device=device)  # the first non-finite gradient's position (-1: none)
        self.grad_positions: list[int] | None = None  # the parameters of the last step's gradients (None: all)
        self.steps: deque[tuple[int, list[tuple[torch.Tensor, torch.Tensor]], list[int] | None]] = deque(
            maxlen=steps_kept
        )

    def note_gradients(self, params: list[torch.Tensor]) -> None:
        """Before clipping (which spreads one NaN to every gradient): which gradient first held a NaN or an inf,
        kept on the device; one foreach call a step (the step runner calls it)."""
        if not self.enabled:
            return
        positions = [i for i, param in enumerate(params) if param.grad is not None]
        self.grad_positions = None if len(positions) == len(params) else positions
        grads = [local(params[i].grad) for i in positions]  # type: ignore[arg-type]
        if grads:
            found = first_nonfinite(grads, self.device)
            self.bad_parameter = torch.where(self.bad_parameter < 0, found, self.bad_parameter)

    def note(self, step: int, batches: list[tuple[torch.Tensor, torch.Tensor]], loss_sum: torch.Tensor,
             grad_norms: torch.Tensor) -> None:  # fmt: skip
        """Step `step`'s micro-batches' (indices, weights), on the host, and the parameters with a gradient; the
        step counted as finite where the interval's sums still are (queued on the device only)."""
        if not self.enabled:
            return
        self.steps.append((step, batches, self.grad_positions))
        gradient = grad_norms.to(loss_sum.device).isfinite() if self.grads_watched else torch.ones_like(loss_sum)
        self.finite_steps += torch.stack([loss_sum.isfinite(), gradient.bool()]).to(self.finite_steps)

    def reset(self) -> None:
        """A new interval (the log line's): its counts from 0, its steps from here."""
        if self.enabled:
            self.finite_steps.zero_()
            self.steps.clear()

    def stop(self, env: DistEnv, run_dir: Path, first_step: int, epoch: int, model: torch.nn.Module,
             params: Sequence[torch.Tensor]) -> JobError:  # fmt: skip
        """Every rank's findings gathered (a collective), their record written by rank 0; the error each rank
        raises. `params`: the step runner's, in its order (the gradients note_gradients saw)."""
        loss_steps, grad_steps = self.finite_steps.tolist()
        parameter, names = int(self.bad_parameter), parameter_names(model, params)
        kept = {step: (batches, positions) for step, batches, positions in self.steps}
        batches, positions = kept.get(first_step + grad_steps, ([], None))
        if parameter >= 0 and positions is not None:  # its place among the step's gradients: the runner's order
            parameter = positions[parameter] if parameter < len(positions) else -1
        indices: dict[str, list[int]] = {}
        mine = {"rank": env.rank, "finite_steps": [loss_steps, grad_steps], "parameter": parameter, "indices": indices}
        for step, (batches, _) in kept.items():
            indices[str(step)] = [i for idx, weights in batches for i in idx[weights.cpu() > 0].tolist()]
        ranks = [json.loads(data) for data in all_gather_bytes(json.dumps(mine).encode(), env.device)]
        record = findings(ranks, names, first_step, epoch)
        path = run_dir / NONFINITE_FILE
        if env.is_main:
            with path.open("a") as file:  # a relaunch that meets another such step adds its record
                file.write(json.dumps(record) + "\n")
        # The record on disk before any rank raises: the launcher stops the whole job at the first
        # rank's error line, rank 0 with it, whether or not it had written the file yet.
        all_gather_int(0, env.device)
        return JobError(error_line(record, path))


def findings(ranks: list[dict[str, Any]], names: list[str], first_step: int, epoch: int) -> dict[str, Any]:
    """The record of the first non-finite step of the interval from `first_step`, from every rank's findings."""
    first = min(min(rank["finite_steps"]) for rank in ranks)
    loss_ranks = [rank["rank"] for rank in ranks if rank["finite_steps"][0] == first]
    grad_ranks = [rank["rank"] for rank in ranks if rank["finite_steps"][1] == first]
    found = [rank["parameter"] for rank in ranks if 0 <= rank["parameter"] < len(names)]
    step = first_step + first
    return {
        "step": step,
        "epoch": epoch,
        "cause": "loss" if loss_ranks else "gradient",
        "ranks": loss_ranks or grad_ranks,
        "parameter": names[min(found)] if found else None,
        "indices": sorted(index for rank in ranks for index in rank["indices"].get(str(step), [])),
        "world_size": len(ranks),
    }


def error_line(record: dict[str, Any], path: Path) -> str:
    indices = record["indices"]
    shown = ", ".join(map(str, indices[:SHOWN])) + (f" and {len(indices) - SHOWN} more" if len(indices) > SHOWN else "")
    where = "rank" + "s" * (len(record["ranks"]) > 1) + " " + ", ".join(map(str, record["ranks"]))
    what = f"the loss is not finite on {where}" if record["cause"] == "loss" else "the gradient is not finite"
    parameter = f"; first non-finite gradient: {record['parameter']}" if record["parameter"] else ""
    return (
        f"training diverged by step {record['step']}: {what}{parameter}; the step's samples {shown} "
        f"(in {path}): relaunch with trainer.skip_samples={path} to leave them out, or lower optim.lr or set "
        "trainer.clip_grad_norm; the run resumes from the last checkpoint (it holds finite weights)"
    )


def skip_list(value: Any) -> list[int]:
    """trainer.skip_samples as indices: a list of them, or a file of records with `indices` (nonfinite.jsonl)."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        path = Path(value)
        if not path.is_file():
            raise ConfigError(f"trainer.skip_samples={value}: no such file; give a nonfinite.jsonl or a list: [3,17]")
        try:
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            return sorted({int(index) for record in records for index in record["indices"]})
        except (ValueError, KeyError, TypeError) as error:
            raise ConfigError(f"trainer.skip_samples={value}: not a file of JSON records with `indices` "
                              f"({type(error).__name__}: {error})") from error  # fmt: skip
    try:
        return sorted({int(index) for index in value})
    except (ValueError, TypeError) as error:
        raise ConfigError(f"trainer.skip_samples must be a list of sample indices or a file, got {value!r}") from error


def leave_out_samples(trainer: Any, sampler: Any, is_main: bool) -> None:
    """Leave trainer.skip_samples out of every epoch (sampler.skip), and say so."""
    indices = skip_list(trainer.skip_samples)
    if not indices:
        return
    size = sampler.dataset_size + len(sampler.skipped)
    if indices[-1] >= size or indices[0] < 0:
        raise ConfigError(f"trainer.skip_samples names sample {indices[-1] if indices[-1] >= size else indices[0]}; "
                          f"the training set's indices are 0 to {size - 1}")  # fmt: skip
    sampler.skip(indices)
    if is_main:
        shown = ", ".join(map(str, indices[:SHOWN])) + (" ..." if len(indices) > SHOWN else "")
        log.info("trainer.skip_samples: %d sample%s left out of every epoch (%s); %d samples an epoch", len(indices),
                 "s" * (len(indices) > 1), shown, sampler.dataset_size)  # fmt: skip


def parameter_names(model: torch.nn.Module, params: Sequence[torch.Tensor]) -> list[str]:
    """`params`' names in `model` (the checkpoint's names), in their order; a position where one has none."""
    names = {id(param): name for name, param in model.named_parameters()}
    return [names.get(id(param), f"parameter {position}") for position, param in enumerate(params)]


def divergence_watch(device: torch.device, log_every_n_steps: int, precision: str) -> NonFiniteWatch:
    """What the trainer keeps of the steps since the last log line (the steps one line covers)."""
    return NonFiniteWatch(device, log_every_n_steps, precision != "fp16")

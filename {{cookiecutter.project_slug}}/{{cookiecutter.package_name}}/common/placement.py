"""Where a job's processes run: the backend and device kind for this many processes per node on this many
GPUs, asked by the launcher (no torch) and by each worker (engine/distributed/process_group.py) so that both
refuse the same combinations with the same line; and where one process sits in the job (DistEnv)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Global rank 0: the one process that writes files shared by the job."""
        return self.rank == 0


@dataclass(frozen=True)
class BackendChoice:
    backend: str
    use_cuda: bool
    shared_gpus: bool  # several local ranks on one GPU (only possible with gloo)


def choose_backend(requested: str, visible_gpus: int, local_world_size: int, mpi_available: bool) -> BackendChoice:
    """The backend and device kind; ConfigError for a combination that cannot work. NCCL refuses two ranks on
    one GPU: with more local ranks than GPUs `auto` falls back to gloo, and `nccl` is refused."""
    enough_gpus = visible_gpus >= local_world_size
    if requested == "auto":
        if visible_gpus == 0:
            return BackendChoice("gloo", use_cuda=False, shared_gpus=False)
        if enough_gpus:
            return BackendChoice("nccl", use_cuda=True, shared_gpus=False)
        return BackendChoice("gloo", use_cuda=True, shared_gpus=True)
    if requested == "nccl":
        if visible_gpus == 0:
            raise ConfigError(
                "dist.backend=nccl needs a GPU and none is visible: use dist.backend=gloo (or auto) on CPUs"
            )
        if not enough_gpus:
            raise ConfigError(
                f"dist.backend=nccl with nproc_per_node={local_world_size} but only {visible_gpus} visible GPU(s): "
                "NCCL cannot put two ranks on one GPU ('Duplicate GPU detected'); "
                f"use nproc_per_node<={visible_gpus} or dist.backend=gloo"
            )
        return BackendChoice("nccl", use_cuda=True, shared_gpus=False)
    if requested == "mpi" and not mpi_available:
        raise ConfigError("dist.backend=mpi: this torch was built without MPI; use dist.backend=gloo or nccl")
    return BackendChoice(requested, use_cuda=visible_gpus > 0, shared_gpus=visible_gpus > 0 and not enough_gpus)


def visible_gpu_count(environ: Mapping[str, str] | None = None, driver: Path = Path("/proc/driver/nvidia/gpus")) -> int:
    """The GPUs a job may use, without torch: CUDA_VISIBLE_DEVICES when set, else the GPUs NVIDIA's driver
    lists (or its device files, where /proc does not show them)."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        return len([item for item in environ["CUDA_VISIBLE_DEVICES"].split(",") if item.strip()])
    if driver.is_dir():
        return len(list(driver.iterdir()))
    return len([path for path in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia[0-9]+", path.name)])

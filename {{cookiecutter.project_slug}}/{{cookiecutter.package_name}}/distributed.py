"""Process group, device and rank helpers.

Every helper answers for a world of one when no process group exists, so the same code runs
under `python train.py` and under torchrun with N ranks. The backend is chosen from the
devices in exactly one place (`choose_backend`); later code asks for `env.device`, never
for the backend.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import hashlib
import inspect
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .config import ConfigError, DDPConfig, DistConfig

log = logging.getLogger(__name__)


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
    """Pick the backend and device kind; raise ConfigError for a combination that cannot work.

    NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so with more local ranks
    than visible GPUs `auto` falls back to gloo with the ranks sharing the GPUs, and an
    explicit `nccl` is refused before NCCL gets the chance to fail obscurely.
    """
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


def check_sync_batchnorm(config: DDPConfig, use_cuda: bool, world_size: int) -> None:
    """SyncBatchNorm runs on GPUs only: on CPUs with several processes DDP's first forward would fail."""
    if config.sync_batchnorm and world_size > 1 and not use_cuda:
        raise ConfigError(
            f"ddp.sync_batchnorm=true needs GPUs (SyncBatchNorm does not run on CPUs), and this job runs {world_size} "
            "processes on CPUs: drop it, or run on GPUs"
        )


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def process_env(config: DistConfig, visible_gpus: int | None = None) -> tuple[int, int, int, int, BackendChoice]:
    """Read torchrun's variables (a world of one without them) and choose the backend.

    `visible_gpus` stands in for the GPUs torch sees when a launch script checks a launch
    for GPUs it was told about (GPUS=...) before the job starts.
    """
    rank, world_size = env_int("RANK", 0), env_int("WORLD_SIZE", 1)
    local_rank, local_world_size = env_int("LOCAL_RANK", 0), env_int("LOCAL_WORLD_SIZE", 1)
    if visible_gpus is None:
        visible_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    choice = choose_backend(config.backend, visible_gpus, local_world_size, dist.is_mpi_available())
    return rank, local_rank, world_size, local_world_size, choice


def restart_store(world_size: int, timeout: datetime.timedelta) -> dist.Store | None:
    """A key space of its own for each torchrun restart, when workers share the agent's store.

    torchrun keeps one TCPStore for the whole job and hands it to every generation of
    workers without a per-restart prefix; a restarted worker can then read the address a
    dead peer published and fail with gloo's "Connection refused". None: plain env://.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    shared = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=timeout
    )
    return dist.PrefixStore(f"restart_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", shared)


@contextlib.contextmanager
def distributed(config: DistConfig, group_of_one: bool = False) -> Iterator[DistEnv]:
    """Initialise the process group from torchrun's environment and always destroy it.

    A world of one has no process group unless `group_of_one` (fsdp's device mesh needs one).
    Exceptions propagate unchanged, so torchrun sees a failed worker and can restart it.
    """
    rank, local_rank, world_size, local_world_size, choice = process_env(config)
    if choice.use_cuda:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1 or group_of_one:
        timeout = datetime.timedelta(seconds=config.timeout_s)
        alone = world_size == 1 and "MASTER_ADDR" not in os.environ  # python train.py: no torchrun store
        dist.init_process_group(
            backend=choice.backend,
            store=dist.HashStore() if alone else restart_store(world_size, timeout),
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            # Binding the device lets NCCL create its communicator eagerly and skip a guess.
            device_id=device if choice.backend == "nccl" else None,
        )
    env = DistEnv(rank, local_rank, world_size, local_world_size, choice.backend, device)
    try:
        if choice.shared_gpus and env.is_main:
            log.warning(
                "%d local ranks share %d GPU(s): using gloo, since NCCL refuses two ranks on one GPU",
                local_world_size,
                torch.cuda.device_count(),
            )
        yield env
    finally:
        if dist.is_initialized():
            # DDP models sit in reference cycles: free the unreachable ones while the process group
            # exists, since a reducer destroyed after it can abort the process at exit.
            gc.collect()
            dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main_process() -> bool:
    return get_rank() == 0


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over all ranks in place (a no-op for a world of one) and return it."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather_int(value: int, device: torch.device) -> list[int]:
    """Every rank's `value`, in rank order."""
    if not is_distributed():
        return [value]
    mine = torch.tensor([value], dtype=torch.int64, device=device)
    gathered = [torch.zeros_like(mine) for _ in range(get_world_size())]
    dist.all_gather(gathered, mine)
    return [int(item.item()) for item in gathered]


def all_gather_bytes(data: bytes, device: torch.device) -> list[bytes]:
    """Every rank's bytes, in rank order (small payloads: generator states, say)."""
    if not is_distributed():
        return [data]
    sizes = all_gather_int(len(data), device)
    mine = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    gathered = [torch.empty_like(mine) for _ in sizes]
    dist.all_gather(gathered, mine)
    return [item[:size].cpu().numpy().tobytes() for item, size in zip(gathered, sizes, strict=True)]


def broadcast_bytes(data: bytes | None, src: int, device: torch.device) -> bytes:
    """Rank `src`'s bytes on every rank (a file, say), through the training backend."""
    size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src)
    if get_rank() == src and data is not None:
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        buffer = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(buffer, src=src)
    return buffer.cpu().numpy().tobytes()


def weights_fingerprint(state: Mapping[str, torch.Tensor]) -> str:
    """A hash of a model's whole state dict: equal on all ranks when DDP kept them in sync."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


BUFFER_BROADCAST_BYTES = 250 * 2**20  # as DDP coalesces its buffer broadcasts


def sync_buffers_from_rank_zero(module: torch.nn.Module) -> None:
    """Give every rank rank 0's buffers (BatchNorm statistics drift apart in every step), in one
    coalesced broadcast: the rule every strategy keeps (DDP's broadcast_buffers, fsdp after each step)."""
    buffers = [buffer for buffer in module.buffers()]
    if is_distributed() and buffers:
        dist._broadcast_coalesced(dist.distributed_c10d._get_default_group(), buffers, BUFFER_BROADCAST_BYTES, 0)


def wrap_ddp(model: nn.Module, config: DDPConfig, env: DistEnv) -> nn.Module:
    """DDP around the model with the ddp.* knobs; the bare model for a world of one."""
    if not is_distributed():
        return model
    # Newer torch renames broadcast_buffers (same meaning here: sync buffers at every forward).
    renamed = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    return DistributedDataParallel(
        model,
        device_ids=[env.device.index] if env.device.type == "cuda" else None,
        bucket_cap_mb=config.bucket_cap_mb,
        gradient_as_bucket_view=config.gradient_as_bucket_view,
        static_graph=config.static_graph,
        find_unused_parameters=config.find_unused_parameters,
        **{"forward_sync_buffers" if renamed else "broadcast_buffers": config.broadcast_buffers},
    )


def gradient_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager[Any]:
    """A context whose backward reduces gradients over the ranks only if `enabled`: DDP's no_sync,
    FSDP2's set_requires_gradient_sync (one reduce-scatter, on the step's last micro-batch)."""
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()
    no_sync = getattr(model, "no_sync", None)  # a world of one has no DDP wrapper
    return no_sync() if no_sync is not None and not enabled else contextlib.nullcontext()

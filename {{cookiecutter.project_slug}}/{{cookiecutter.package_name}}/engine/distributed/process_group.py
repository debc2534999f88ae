"""Process group, device and rank helpers and collectives, each answering for a world of one without a process
group (`python train.py` and torchrun run the same code). The backend is chosen in one place (common/placement.py's
choose_backend); later code asks for `env.device`, never for the backend.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import hashlib
import io
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from ...common.placement import BackendChoice, DistEnv, choose_backend
from ...config import DistConfig

log = logging.getLogger(__name__)


def keep_ddp_working_on_gloo(backend: str) -> None:
    """Before the process group exists: on gloo, TORCH_DISTRIBUTED_DEBUG=DETAIL becomes INFO, since DETAIL's
    collective checker makes DDP's constructor segfault there (c10d::Logger::set_env_variables, torch 2.14)."""
    if backend == "gloo" and dist.get_debug_level() == dist.DebugLevel.DETAIL:
        dist.set_debug_level(dist.DebugLevel.INFO)


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def process_env(config: DistConfig, visible_gpus: int | None = None) -> tuple[int, int, int, int, BackendChoice]:
    """torchrun's variables (a world of one without them) and the backend; `visible_gpus` stands in for the GPUs
    torch sees (a launch checked for the GPUS=... it was told about)."""
    rank, world_size = env_int("RANK", 0), env_int("WORLD_SIZE", 1)
    local_rank, local_world_size = env_int("LOCAL_RANK", 0), env_int("LOCAL_WORLD_SIZE", 1)
    if visible_gpus is None:
        visible_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    choice = choose_backend(config.backend, visible_gpus, local_world_size, dist.is_mpi_available())
    return rank, local_rank, world_size, local_world_size, choice


def restart_store(world_size: int, timeout: datetime.timedelta) -> dist.Store | None:
    """A key space of its own for each torchrun restart where workers share the agent's store (else a restarted
    worker can read a dead peer's address and fail with gloo's "Connection refused"); None: plain env://."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    shared = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=timeout
    )
    return dist.PrefixStore(f"restart_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", shared)


REFUSED_KEY = f"{__package__}.refused"  # a node's refusal, in the workers' store for the other nodes


def store_client(seconds: float) -> dist.Store | None:
    """A client of the workers' store (MASTER_ADDR:MASTER_PORT), or None where none answers within `seconds`."""
    try:
        address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        timeout = datetime.timedelta(seconds=seconds)
        return dist.TCPStore(address, port, is_master=False, timeout=timeout, wait_for_workers=False)
    except (KeyError, ValueError, RuntimeError):  # torch's DistNetworkError is a RuntimeError
        return None


def tell_the_other_nodes(line: str) -> None:
    """This node's refusal, before it joins the process group, in the workers' store for the other nodes'
    workers (refusals_of_other_nodes); best effort: a store that does not answer leaves it to the launchers."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and env_int("RANK", 0) == 0:
        return  # the workers' store would be this rank's own (an elastic job's), never started
    if env_int("GROUP_WORLD_SIZE", 1) > 1 and (store := store_client(5)) is not None:
        with contextlib.suppress(RuntimeError):
            store.set(REFUSED_KEY, f"node {env_int('GROUP_RANK', 0)} refused the job: {line}")


@contextlib.contextmanager
def refusals_of_other_nodes(on_refused: Callable[[str], object] | None) -> Iterator[None]:
    """While this rank waits for the process group to form: another node's refusal, read from the workers' store,
    goes to `on_refused` (which ends the process) rather than this rank waiting until dist.timeout_s."""
    if on_refused is None or env_int("GROUP_WORLD_SIZE", 1) <= 1:
        yield
        return
    joined = threading.Event()

    def watch() -> None:
        store = None
        while not joined.wait(0.5):
            store = store or store_client(2)
            try:
                if store is not None and store.check([REFUSED_KEY]):
                    on_refused(store.get(REFUSED_KEY).decode())
                    return
            except RuntimeError:  # the store went away: its host's launcher says why
                store = None

    threading.Thread(target=watch, name="refusals of other nodes", daemon=True).start()
    try:
        yield
    finally:
        joined.set()


@contextlib.contextmanager
def distributed(
    config: DistConfig, group_of_one: bool = False, on_refused: Callable[[str], object] | None = None
) -> Iterator[DistEnv]:
    """The process group from torchrun's environment (a world of one has none unless `group_of_one`), always
    destroyed; exceptions propagate unchanged (torchrun restarts a failed worker). `on_refused`: as above."""
    rank, local_rank, world_size, local_world_size, choice = process_env(config)
    if choice.use_cuda:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1 or group_of_one:
        timeout = datetime.timedelta(seconds=config.timeout_s)
        alone = world_size == 1 and "MASTER_ADDR" not in os.environ  # python train.py: no torchrun store
        with refusals_of_other_nodes(on_refused):
            dist.init_process_group(
                backend=choice.backend,
                store=dist.HashStore() if alone else restart_store(world_size, timeout),
                rank=rank,
                world_size=world_size,
                timeout=timeout,
                # Binding the device lets NCCL create its communicator eagerly and skip a guess.
                device_id=device if choice.backend == "nccl" else None,
            )
        # What exists by now (the imports: torch's whole heap) is set aside from the collector, so that
        # the collection before the group goes walks only what the run made (docs/speed.md).
        gc.freeze()
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
        gc.unfreeze()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` summed over all ranks in place."""
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
    if data:  # torch.frombuffer refuses an empty buffer; a rank may have nothing to say
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    gathered = [torch.empty_like(mine) for _ in sizes]
    dist.all_gather(gathered, mine)
    return [item[:size].cpu().numpy().tobytes() for item, size in zip(gathered, sizes, strict=True)]


def all_gather_tensors(piece: dict[str, Any], device: torch.device, keep: bool = True) -> list[dict[str, Any]]:
    """Every rank's `piece` (tensors on the host, in dicts), in rank order, read back with weights_only; []
    where not `keep` (an all-gather all the same)."""
    if not is_distributed():
        return [piece] if keep else []
    buffer = io.BytesIO()
    torch.save(piece, buffer)
    pieces = all_gather_bytes(buffer.getvalue(), device)
    return [torch.load(io.BytesIO(data), weights_only=True) for data in pieces] if keep else []


def broadcast_bytes(data: bytes | None, src: int, device: torch.device) -> bytes:
    """Rank `src`'s bytes on every rank (a file, say)."""
    size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src)
    if get_rank() == src and data:
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
    """Rank 0's buffers (BatchNorm statistics drift apart in every step) on every rank, in one coalesced broadcast."""
    buffers = list(module.buffers())
    if is_distributed() and buffers:
        dist._broadcast_coalesced(dist.distributed_c10d._get_default_group(), buffers, BUFFER_BROADCAST_BYTES, 0)

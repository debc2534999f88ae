"""The communication check to run before a long job: `bash scripts/check_comm.sh [KEY=VALUE ...]`.

Runs every collective the training relies on, on the backend training would use (composed from
configs/train.yaml with the same overrides), verifies each result, shows where every rank runs,
measures all_reduce bus bandwidth as nccl-tests reports it, and ends with a PASS/FAIL table.
Exit code 0 only when everything passed.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist
from hydra import compose, initialize_config_dir

from .common.errors import ConfigError
from .common.placement import DistEnv
from .config import config_dir, register_configs, to_train_config
from .engine.distributed.process_group import distributed

SIZES_BYTES = [2**k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def check_all_reduce(env: DistEnv) -> str:
    value = torch.full((1024,), float(env.rank + 1), device=env.device)
    dist.all_reduce(value)
    wanted = env.world_size * (env.world_size + 1) / 2
    expect(bool(torch.all(value == wanted)), f"sum {value[0].item()} != {wanted}")
    return f"sum of 1..{env.world_size} = {wanted:g}"


def check_broadcast(env: DistEnv) -> str:
    for source in {0, env.world_size - 1}:
        value = torch.full((1024,), float(env.rank == source) * 7.0, device=env.device)
        dist.broadcast(value, src=source)
        expect(bool(torch.all(value == 7.0)), f"from rank {source}: got {value[0].item()}")
    return "from the first and the last rank"


def check_all_gather(env: DistEnv) -> str:
    mine = torch.full((4,), float(env.rank), device=env.device)
    gathered = [torch.empty_like(mine) for _ in range(env.world_size)]
    dist.all_gather(gathered, mine)
    expect([int(t[0].item()) for t in gathered] == list(range(env.world_size)), "ranks out of order")
    return f"{env.world_size} ranks in order"


def check_barrier(env: DistEnv) -> str:
    started = time.perf_counter()
    dist.barrier()
    return f"{1e3 * (time.perf_counter() - started):.1f} ms"


def check_subgroup(env: DistEnv) -> str:
    evens = list(range(0, env.world_size, 2)) if env.world_size >= 4 else list(range(env.world_size))
    group = dist.new_group(ranks=evens)  # every rank must take part in creating it
    if env.rank in evens:
        value = torch.ones(16, device=env.device)
        dist.all_reduce(value, group=cast(dist.ProcessGroup, group))  # a member: not NON_GROUP_MEMBER
        expect(bool(torch.all(value == len(evens))), f"sum {value[0].item()} != {len(evens)}")
    dist.barrier()
    return f"all_reduce in new_group(ranks={evens})"


CHECKS: list[tuple[str, Callable[[DistEnv], str]]] = [
    ("all_reduce", check_all_reduce),
    ("broadcast", check_broadcast),
    ("all_gather", check_all_gather),
    ("barrier", check_barrier),
    ("new_group", check_subgroup),
]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bus_bandwidth(env: DistEnv, size_bytes: int, iterations: int) -> tuple[float, float, float]:
    """(microseconds per all_reduce, algbw GB/s, busbw GB/s); busbw = algbw * 2(n-1)/n as in nccl-tests."""
    tensor = torch.ones(size_bytes // 4, dtype=torch.float32, device=env.device)
    for _ in range(2):
        dist.all_reduce(tensor)
    synchronize(env.device)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(tensor)
    synchronize(env.device)
    seconds = (time.perf_counter() - started) / iterations
    elapsed = torch.tensor([seconds], dtype=torch.float64, device=env.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    seconds = float(elapsed.item())
    algbw = size_bytes / seconds / 1e9
    return 1e6 * seconds, algbw, algbw * 2 * (env.world_size - 1) / env.world_size


def where_ranks_run(env: DistEnv) -> list[str]:
    rows: list[Any] = [None] * env.world_size
    dist.all_gather_object(rows, (env.rank, socket.gethostname(), env.local_rank, str(env.device), env.backend))
    return [f"{r:>4}  {host:<20} {local:>10}  {device:<8} {backend}" for r, host, local, device, backend in rows]


def run_checks(env: DistEnv) -> bool:
    """Run everything; print on rank 0; True when all passed."""
    results = []
    for name, check in CHECKS:
        try:
            results.append((name, "PASS", check(env)))
        except Exception as error:  # report and go on: the table must show every check
            results.append((name, "FAIL", str(error).splitlines()[0][:100]))
    hosts = where_ranks_run(env)
    bandwidth = [(size, *bus_bandwidth(env, size, 20 if size < 2**22 else 5)) for size in SIZES_BYTES]
    if env.is_main:
        print(f"world size {env.world_size}, backend {env.backend}")
        print("rank  host                 local_rank  device   backend")
        print("\n".join(hosts))
        print(f"\nall_reduce of float32, busbw = algbw * 2(n-1)/n (n={env.world_size}), as nccl-tests reports it")
        print(f"{'size':>10} {'time_us':>12} {'algbw_GB/s':>12} {'busbw_GB/s':>12}")
        for size, micros, algbw, busbw in bandwidth:
            print(f"{size:>10} {micros:>12.1f} {algbw:>12.3f} {busbw:>12.3f}")
        print(f"\n{'check':<12} {'result':<7} detail")
        for name, verdict, detail in results:
            print(f"{name:<12} {verdict:<7} {detail}")
        passed = all(verdict == "PASS" for _, verdict, _ in results)
        print(f"{'overall':<12} {'PASS' if passed else 'FAIL'}", flush=True)
    return all(verdict == "PASS" for _, verdict, _ in results)


def main(overrides: list[str]) -> int:
    register_configs()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            config = to_train_config(compose(config_name="train", overrides=overrides))
        with distributed(config.dist) as env:
            if not dist.is_initialized():  # a world of one still exercises every call
                dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            return 0 if run_checks(env) else 1
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

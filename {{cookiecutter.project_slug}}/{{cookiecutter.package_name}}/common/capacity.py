"""Whether this machine can hold a job's processes, and what the kernel's out-of-memory killer did to them:
said in one line, not found out after minutes of swapping (docs/launching.md)."""

from __future__ import annotations

import contextlib
import os
import resource
from pathlib import Path

GIB = 2**30
WORKER_START_BYTES = GIB // 2  # a worker that has imported torch and the project, before its model


def cpu_cores() -> int:
    """The cores this process may run on: its affinity (a cpuset or taskset leaves fewer than the machine has)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes this job may still take: the machine's MemAvailable, or less under a cgroup limit."""
    amounts = []
    with contextlib.suppress(OSError, StopIteration, ValueError):
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        amounts.append(int(next(line for line in meminfo if line.startswith("MemAvailable:")).split()[1]) * 1024)
    if (folder := own_cgroup()) is not None:
        v2 = (folder / "memory.max").is_file()
        limit, usage = ("memory.max", "memory.current") if v2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
        with contextlib.suppress(OSError, ValueError):
            limit_text = (folder / limit).read_text().strip()
            if limit_text != "max" and int(limit_text) < 2**60:  # v1 writes "no limit" as a huge number
                amounts.append(int(limit_text) - int((folder / usage).read_text()))
    return min(amounts) if amounts else None


def own_cgroup() -> Path | None:
    """This process's memory cgroup folder (v2, or v1's memory controller), or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            folder = Path("/sys/fs/cgroup") / path.lstrip("/")
            if (folder / "memory.events").is_file():
                return folder
        if "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if (folder / "memory.oom_control").is_file():
                return folder
    return None


def oom_kills(folder: Path | None = None) -> int | None:
    """How many processes of this cgroup the out-of-memory killer has ended so far (None: unknown)."""
    folder = folder if folder is not None else own_cgroup()
    for name in ("memory.events", "memory.oom_control"):  # v2, v1
        with contextlib.suppress(OSError, StopIteration, ValueError):
            lines = (folder / name).read_text().splitlines() if folder else []
            return int(next(line for line in lines if line.startswith("oom_kill ")).split()[1])
    return None


def peak_rss() -> int:
    """This process's peak resident memory, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def check_processes_fit(
    nproc: int, per_process: int, on_gpus: bool, available: int | None, measured: str = "a worker's start takes"
) -> str | None:
    """None when `nproc` processes of about `per_process` bytes each fit in memory; else the one line that
    refuses them (`measured`: what the estimate is)."""
    if available is None or nproc * per_process <= available:
        return None
    most = max(1, available // per_process)
    return (
        f"NPROC_PER_NODE={nproc} would need about {nproc * per_process / GIB:.1f} GiB ({nproc} processes of about "
        f"{per_process / GIB:.2f} GiB, as {measured}) and this machine has "
        f"{available / GIB:.1f} GiB available: start at most {most} processes"
        + ("" if on_gpus else " (on CPUs, the cores are the better limit)")
    )


def too_many_for_the_cores(nproc: int, on_gpus: bool) -> str | None:
    """A warning where CPU processes outnumber the cores (they share them and each runs slower)."""
    cores = cpu_cores()
    if on_gpus or nproc <= cores:
        return None
    return (
        f"warning: NPROC_PER_NODE={nproc} CPU processes on {cores} cores: they share the cores, so the job runs "
        f"no faster than with {cores}"
    )


def oom_line(before: int | None, after: int | None) -> str | None:
    """The one line that names out-of-memory kills during the job, if the kernel counted any."""
    if before is None or after is None or after <= before:
        return None
    return (
        f"the kernel's out-of-memory killer ended {after - before} process(es) of this job: lower NPROC_PER_NODE or "
        "data.batch_size, or give the job more memory"
    )

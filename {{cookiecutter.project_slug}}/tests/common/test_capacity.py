"""common/capacity.py: whether the machine holds the job, and the kernel's out-of-memory kills named."""

from __future__ import annotations

from pathlib import Path

from {{cookiecutter.package_name}}.common.capacity import (
    GIB,
    check_processes_fit,
    cpu_cores,
    oom_kills,
    oom_line,
    own_cgroup,
    too_many_for_the_cores,
)


def test_processes_that_fit_pass_and_those_that_do_not_are_refused_with_the_most_that_fit() -> None:
    assert check_processes_fit(4, GIB // 2, on_gpus=False, available=8 * GIB) is None
    assert check_processes_fit(4, GIB // 2, on_gpus=False, available=None) is None, "unknown: no refusal"
    refusal = check_processes_fit(64, GIB // 2, on_gpus=True, available=21 * GIB)
    assert refusal == ("NPROC_PER_NODE=64 would need about 32.0 GiB (64 processes of about 0.50 GiB, as a worker's "
                       "start takes) and this machine has 21.0 GiB available: start at most 42 processes")  # fmt: skip


def test_more_cpu_processes_than_cores_are_warned_about() -> None:
    cores = cpu_cores()
    assert too_many_for_the_cores(cores, on_gpus=False) is None
    assert too_many_for_the_cores(cores + 1, on_gpus=True) is None
    assert too_many_for_the_cores(cores + 1, on_gpus=False).startswith(f"warning: NPROC_PER_NODE={cores + 1} CPU")


def test_the_kernels_oom_kills_are_counted_and_named(tmp_path: Path) -> None:
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\noom_group_kill 0\n")
    assert oom_kills(tmp_path) == 2
    assert oom_kills(tmp_path / "none") is None
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")  # cgroup v1's
    assert oom_kills(v1) == 5
    assert oom_kills() is not None or own_cgroup() is None, "this machine's own count, where it keeps one"
    assert oom_line(2, 2) is None and oom_line(None, 5) is None
    assert oom_line(2, 3) == ("the kernel's out-of-memory killer ended 1 process(es) of this job: lower "
                              "NPROC_PER_NODE or data.batch_size, or give the job more memory")  # fmt: skip

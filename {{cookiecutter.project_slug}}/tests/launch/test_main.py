"""launch/main.py in-process: a refused launch exits 2 with one line, before torchrun and without a run
dir (the launch scripts themselves: tests/e2e/test_launch.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.launch import job as job_module
from {{cookiecutter.package_name}}.launch.main import main

from ..helpers import TINY_JOB, free_port, quick_jobs


def test_a_refused_launch_exits_2_with_one_line_and_leaves_no_run_dir(tmp_path: Path, monkeypatch, capsys) -> None:
    # The launcher's main() in-process: what the launch scripts' refusals (tests/e2e/) see, without their seconds.
    monkeypatch.chdir(tmp_path)  # run dirs are made under ./outputs
    with pytest.raises(SystemExit) as exited:
        main(["single", "NPROC_PER_NODE=2", "task=classification", "data=synthetic", "data.batch_size=0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: data.batch_size must be a whole number >= 1, got 0\n", err
    assert not (tmp_path / "outputs").exists(), "a refused launch must not create a run dir"


def test_a_job_runs_in_the_run_dir_given(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[list[str]] = []
    monkeypatch.setattr(job_module, "torchrun", quick_jobs(calls))
    assert main(["single", "NPROC_PER_NODE=1", f"RUN_DIR={tmp_path / 'mine'}", *TINY_JOB]) == 0
    assert calls == [TINY_JOB] and (tmp_path / "mine" / "metrics.jsonl").is_file()
    assert not (tmp_path / "outputs").exists(), "RUN_DIR, not a new run dir under outputs/"


def test_a_nodes_launch_takes_the_defaults_of_scripts_cluster_env(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "cluster.env").write_text(f"MASTER_ADDR=127.0.0.1\nMASTER_PORT={free_port()}\nNNODES=1\n")
    calls: list[list[str]] = []
    launches = []
    job = quick_jobs(calls)

    def torchrun(launch, *args, **kwargs) -> int:
        launches.append(launch)
        return job(launch, *args, **kwargs)

    monkeypatch.setattr(job_module, "torchrun", torchrun)
    assert main(["multi", "NODE_RANK=0", "NPROC_PER_NODE=1", f"RUN_DIR={tmp_path / 'run'}", *TINY_JOB]) == 0
    assert launches[0].values["MASTER_ADDR"] == "127.0.0.1" and launches[0].values["NNODES"] == "1"


@pytest.mark.parametrize(("code", "said"), [(0, "warning: {} (torchrun restarted them)"), (1, "error: {}")])
def test_workers_the_kernel_killed_for_memory_are_named_in_one_line(tmp_path: Path, monkeypatch, capsys, code: int,
                                                                    said: str) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(job_module, "torchrun", quick_jobs([], code=code))
    counts = iter([3, 4])  # the cgroup's oom_kill count before the job and after: one worker killed
    monkeypatch.setattr(job_module, "oom_kills", lambda: next(counts))
    assert main(["single", "NPROC_PER_NODE=1", f"RUN_DIR={tmp_path / 'run'}", *TINY_JOB]) == code
    line = (
        "the kernel's out-of-memory killer ended 1 process(es) of this job: lower NPROC_PER_NODE or data.batch_size, "
        "or give the job more memory"
    )
    assert said.format(line) in capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("threads", ["abc", "0", "-3", "2.5"])
def test_a_bad_omp_num_threads_is_refused_in_one_line_before_torchrun(tmp_path: Path, monkeypatch, capsys, threads):
    """torch reads OMP_NUM_THREADS in every worker and ignores (or warns on) a value it cannot take: refused here."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", threads)
    calls: list = []
    monkeypatch.setattr(job_module, "torchrun", quick_jobs(calls))
    with pytest.raises(SystemExit) as exited:
        main(["single", *TINY_JOB])
    assert exited.value.code == 2 and not calls
    err = capsys.readouterr().err
    assert err.startswith(f"error: OMP_NUM_THREADS={threads}: give a whole number of threads per process, at least 1")
    assert err.count("\n") == 1, err
    assert not (tmp_path / "outputs").exists()


def test_m_in_a_project_made_without_sweeps_is_one_line_before_any_job(tmp_path: Path, monkeypatch, capsys) -> None:
    """cookiecutter's sweeps=no leaves no sweep.py: -m is then refused, not handed to Hydra or torchrun."""
    from {{cookiecutter.package_name}}.launch import main as main_module

    monkeypatch.chdir(tmp_path)
    calls: list[list[str]] = []
    monkeypatch.setattr(job_module, "torchrun", quick_jobs(calls))
    monkeypatch.setattr(main_module, "sweep_module", lambda: None)
    for argv in (["single", "-m", "optim.lr=0.1,0.2", *TINY_JOB], ["multi", "NODE_RANK=0", "-m", *TINY_JOB]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2 and calls == [] and not (tmp_path / "outputs").exists()
        said = "error: -m: this project was made without sweeps (cookiecutter's sweeps=no): launch each config as"
        assert capsys.readouterr().err == f"{said} its own job\n"

"""The launch layer (launch.py): keys, pass-through, sweeps, errors; in-process where it can be."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.launch import (
    KEYS,
    LaunchError,
    lock_run_dir,
    parse_args,
    plan,
    preflight,
    read_cluster_env,
    require_free_port,
    results_table,
    sweep_points,
    usage,
    worker_environment,
)

from .conftest import PROJECT_DIR, PYTHON, SMALL, last_line, project_copy, read_metrics, run


def planned(mode: str, *argv: str, environ: dict[str, str] | None = None, cluster: dict[str, str] | None = None):
    args = parse_args(list(argv), mode)
    return plan(mode, args, {"CUDA_VISIBLE_DEVICES": "", **(environ or {})}, cluster or {})


def test_the_command_line_is_sorted_into_keys_hydra_flags_overrides_and_torchrun_flags() -> None:
    args = parse_args(["NPROC_PER_NODE=3", "--cfg", "job", "model=resnet18", "-m", "optim.lr=0.1,0.2", "--",
                       "--log-dir=/tmp/x", "--redirects=3"], "single")  # fmt: skip
    assert args.keys == {"NPROC_PER_NODE": "3"} and args.multirun
    assert args.hydra_flags == ["--cfg", "job"] and args.overrides == ["model=resnet18", "optim.lr=0.1,0.2"]
    assert args.torchrun_flags == ["--log-dir=/tmp/x", "--redirects=3"]
    assert parse_args(["--info", "defaults", "--help"], "single").hydra_flags == ["--info", "defaults"]


def test_torchrun_flags_after_the_separator_reach_torchrun() -> None:
    launch = planned("single", "NPROC_PER_NODE=2", "--", "--log-dir=/tmp/x", "--local-ranks-filter=0")
    assert launch.torchrun_args == ["--standalone", "--nproc-per-node=2", "--max-restarts=3", "--log-dir=/tmp/x",
                                    "--local-ranks-filter=0"]  # fmt: skip


@pytest.mark.parametrize(
    "environ",
    [
        {"NODE_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29123", "NNODES": "3"},
        {"PET_NODE_RANK": "1", "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": "29123", "PET_NNODES": "3"},
    ],
)
def test_a_schedulers_environment_fills_the_keys_the_command_line_leaves_out(environ: dict[str, str]) -> None:
    launch = planned("multi", "NPROC_PER_NODE=1", environ=environ)
    assert {"--nnodes=3", "--node-rank=1", "--master-addr=127.0.0.1", "--master-port=29123"} <= set(
        launch.torchrun_args
    )
    mine = planned("multi", "NPROC_PER_NODE=1", "NODE_RANK=2", environ=environ)
    assert "--node-rank=2" in mine.torchrun_args, "the command line wins"


def test_cluster_env_gives_defaults_below_the_environment(tmp_path: Path) -> None:
    (tmp_path / "cluster.env").write_text("# a comment\nMASTER_ADDR=127.0.0.1\nMASTER_PORT=29321\nNNODES=4\n")
    cluster = read_cluster_env(tmp_path / "cluster.env")
    assert cluster == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29321", "NNODES": "4"}
    launch = planned("multi", "NODE_RANK=1", "NPROC_PER_NODE=1", environ={"NNODES": "2"}, cluster=cluster)
    assert {"--nnodes=2", "--master-port=29321"} <= set(launch.torchrun_args)


def test_workers_get_one_thread_exact_mkl_and_a_shutdown_grace_for_the_checkpoint() -> None:
    launch = planned("single", "SHUTDOWN_TIMEOUT_S=115")
    assert launch.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "115"
    assert worker_environment({}) == {"OMP_NUM_THREADS": "1", "MKL_CBWR": "AUTO,STRICT"}
    assert worker_environment({"OMP_NUM_THREADS": "4"})["OMP_NUM_THREADS"] == "4"


@pytest.mark.parametrize(
    ("mode", "argv", "message"),
    [
        ("single", ["FOO=1"], "unknown key FOO"),
        ("single", ["NPROC_PER_NODE=two"], "NPROC_PER_NODE=two is not a whole number"),
        ("single", ["NPROC_PER_NODE=0"], "NPROC_PER_NODE=0 must be at least 1"),
        ("single", ["MAX_RESTARTS=-1"], "MAX_RESTARTS=-1 is not a whole number"),
        ("single", ["--bogus"], "unknown flag --bogus: give torchrun's flags after --"),
        ("single", ["GPUS=a,b"], "GPUS=a,b: give GPU indices separated by commas"),
        ("single", ["GPUS=1,1"], "GPUS=1,1 lists a GPU twice"),
        ("multi", [], "NODE_RANK is required"),
        ("multi", ["NODE_RANK=2", "NNODES=2"], "NODE_RANK=2 is outside 0..1 for NNODES=2"),
        ("multi", ["NODE_RANK=0", "NNODES=two"], "NNODES=two is not a whole number"),
        ("multi", ["NODE_RANK=0", "NNODES=3:2"], "NNODES=3:2: MIN is larger than MAX"),
        ("multi", ["NODE_RANK=0", "NPROC_PER_NODE=1.5"], "NPROC_PER_NODE=1.5 is not a whole number"),
        ("multi", ["NODE_RANK=1"], "MASTER_ADDR is required on node 1"),
        ("multi", ["NODE_RANK=0", "MASTER_PORT=70000"], "MASTER_PORT=70000 is outside 1..65535"),
        ("multi", ["NODE_RANK=0", "MASTER_PORT=0"], "MASTER_PORT=0 must be at least 1"),
        ("multi", ["NODE_RANK=1", "MASTER_ADDR=no-such-host.invalid"], "MASTER_ADDR=no-such-host.invalid does not"),
        ("multi", ["NODE_RANK=0", "RUN_DIR=x"], "unknown key RUN_DIR"),
    ],
)
def test_bad_keys_are_one_line_errors(mode: str, argv: list[str], message: str) -> None:
    with pytest.raises(LaunchError) as error:
        planned(mode, *argv)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_taken_port_is_refused_on_node_zero() -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LaunchError, match=f"MASTER_PORT={port} is already in use on this machine"):
            require_free_port(port)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.batch_size=0"], "data.batch_size must be a whole number >= 1, got 0"),
        (["ddp.bucket_cap_mb=0"], "ddp.bucket_cap_mb must be > 0"),
        (["dist.backend=nccl"], "dist.backend=nccl"),
        (["model=vgg11"], "Could not find 'model/vgg11'; choose one of: gpt, resnet18, resnet50, small_cnn"),
        (["data.batch_size=abc"], "data.batch_size must be a whole number >= 1, got 'abc'"),
        (["data.train_size=0"], "data.train_size must be >= 1, got 0"),
        (["trainer.epoch=3"], "To append to your config use +trainer.epoch=3"),
        (["data=cifar10", "data.root=/nonexistent"], "CIFAR-10 not found: /nonexistent/cifar-10-batches-py lacks"),
        (["data=image_folder", "data.root=/nonexistent"], "image_folder: /nonexistent/train does not exist"),
        (["checkpoint.resume=/nonexistent.pt"], "checkpoint.resume=/nonexistent.pt: no such file"),
    ],
)
def test_preflight_refuses_bad_config_with_one_line(overrides: list[str], message: str) -> None:
    launch = planned("single", "NPROC_PER_NODE=2")
    with pytest.raises(LaunchError) as error:
        preflight(["task=classification", "data=synthetic", "model=small_cnn", *overrides], None, launch)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_help_lists_every_key_with_its_default() -> None:
    text = usage("multi")
    for key in KEYS:
        if "multi" in key.modes:
            assert re.search(rf"^  {key.name} +{re.escape(key.default or '-')} ", text, flags=re.M), key.name
    assert "RDZV_LAST_CALL_S" in text and "RUN_DIR" not in text


def test_sweep_points_are_the_product_of_the_lists() -> None:
    points = sweep_points(["optim.lr=0.1,0.05", "model=small_cnn,resnet18", "trainer.epochs=1"])
    assert points == [
        ["optim.lr=0.1", "model=small_cnn", "trainer.epochs=1"],
        ["optim.lr=0.1", "model=resnet18", "trainer.epochs=1"],
        ["optim.lr=0.05", "model=small_cnn", "trainer.epochs=1"],
        ["optim.lr=0.05", "model=resnet18", "trainer.epochs=1"],
    ]
    table = results_table([{"point": 0, "overrides": ["optim.lr=0.1"], "status": "done", "reason": "",
                            "final": {"val_loss": 0.5, "val_acc": 0.9, "val_samples": 10}}])  # fmt: skip
    assert table.splitlines()[0] == "| point | overrides | status | val_loss | val_acc | val_samples |"
    assert table.splitlines()[2] == "| 0 | optim.lr=0.1 | done | 0.5 | 0.9 | 10 |"


def test_script_errors_are_one_line_without_traceback() -> None:
    for script, argv in (("run_single.sh", ["data=synthetic", "data.batch_size=0"]), ("run_multi.sh", ["NODE_RANK=x"]),
                         ("check_comm.sh", ["FOO=1"])):  # fmt: skip
        proc = run(["bash", f"scripts/{script}", *argv], expect_ok=False, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (script, proc.stderr)
        assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stdout + proc.stderr


def test_hydra_flags_pass_through_the_script() -> None:
    proc = run(["bash", "scripts/run_single.sh", "--cfg", "job", "model=resnet18"])
    assert "_target_: torchvision.models.resnet18" in proc.stdout
    helped = run(["bash", "scripts/run_single.sh", "--help"])
    assert "NPROC_PER_NODE" in helped.stdout and "Powered by Hydra" in helped.stdout


JOB = [*SMALL, "trainer.epochs=1", "data.train_size=128", "data.val_size=50"]


@pytest.mark.slow
def test_torchrun_flags_pass_through_the_script(tmp_path: Path) -> None:
    run(["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", f"RUN_DIR={tmp_path / 'run'}", *JOB, "--",
         f"--log-dir={tmp_path / 'torchrun_logs'}", "--redirects=3", "--local-ranks-filter=0"])  # fmt: skip
    logs = list((tmp_path / "torchrun_logs").rglob("stdout.log"))
    assert len(logs) == 2, "torchrun wrote each rank's output where --log-dir said"


@pytest.mark.slow
def test_a_sweep_runs_each_point_once_and_continues_where_it_stopped(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    command = ["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", f"SWEEP_DIR={sweep_dir}", "-m",
               "optim.lr=0.1,-1,0.05", *JOB]  # fmt: skip
    first = run(command, expect_ok=False)
    assert first.returncode == 1, "a failed point makes the sweep's exit code 1"
    table = (sweep_dir / "results.md").read_text()
    rows = [line for line in table.splitlines()[2:]]
    assert len(rows) == 3 and "| done |" in rows[0] and "failed (optim.lr must be a number > 0" in rows[1], table
    assert "| done |" in rows[2] and table in first.stdout
    runs = sorted(path.name for path in sweep_dir.iterdir() if path.is_dir())
    assert runs == ["000_optim.lr=0.1", "001_optim.lr=-1", "002_optim.lr=0.05"]
    assert read_metrics(sweep_dir / runs[0])[-1]["kind"] == "val"
    # The third point was interrupted (its status lost): launched again, it resumes from its checkpoint.
    (sweep_dir / runs[2] / "sweep_point.json").unlink()
    again = run(command, expect_ok=False)
    assert "point 0: optim.lr=0.1" in again.stdout and "done before, not trained again" in again.stdout
    assert "training had already finished" in again.stderr, "the interrupted point resumed, not restarted"
    assert json.loads((sweep_dir / runs[2] / "sweep_point.json").read_text())["status"] == "done"


@pytest.mark.slow
def test_a_real_bug_is_named_by_rank_with_its_traceback(tmp_path: Path) -> None:
    project = project_copy(tmp_path / "project")
    (project / "buggy.py").write_text(
        "import os\nfrom torch import nn\n\n\nclass Buggy(nn.Linear):\n"
        "    def forward(self, x):\n        if os.environ.get('RANK') == '1' and not self.training:\n"
        "            raise RuntimeError('bug in the model on rank 1')\n        return super().forward(x.flatten(1))\n"
    )
    proc = run(["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", "MAX_RESTARTS=0", f"RUN_DIR={tmp_path / 'run'}",
                *JOB, "model._target_=buggy.Buggy", "+model.in_features=3072", "+model.out_features=10",
                "~model.width", "~model.num_classes"], cwd=project, expect_ok=False)  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert re.search(r"rank\s*:\s*1 ", output) and "RuntimeError: bug in the model on rank 1" in output, output[-3000:]
    assert 'raise RuntimeError("bug' in output or "raise RuntimeError('bug" in output, "the traceback, not only a line"


@pytest.mark.slow
def test_pip_install_gives_a_working_package_with_its_configs(tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([PYTHON, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target",
                    str(target), str(PROJECT_DIR)], check=True, capture_output=True)  # fmt: skip
    package = "{{cookiecutter.package_name}}"
    assert (target / package / "configs" / "model" / "small_cnn.yaml").is_file()
    elsewhere = tmp_path / "elsewhere"  # not the project: only the installed package can be found
    elsewhere.mkdir()
    env = {"PYTHONPATH": str(target)}
    shown = run([str(target / "bin" / f"{package}-train"), "--cfg", "job"], cwd=elsewhere, env=env)
    assert "_target_:" in shown.stdout
    trained = run([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
                   f"{package}.train", f"hydra.run.dir={elsewhere / 'run'}", *JOB], cwd=elsewhere, env=env)  # fmt: skip
    assert "final: val_loss=" in last_line(trained.stderr)
    assert sys.modules[package].__file__.startswith(str(PROJECT_DIR)), "the tests themselves use the source tree"


@pytest.mark.slow
def test_an_optuna_sweep_runs_one_torchrun_job_per_trial(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    sweep_dir = tmp_path / "sweep"
    space = ["hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "optim.lr=tag(log,interval(0.01,0.3))"]
    command = ["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", f"SWEEP_DIR={sweep_dir}", "-m", *space, *JOB]
    first = run(command)
    trials = [json.loads((sweep_dir / f"00{i}_trial" / "sweep_point.json").read_text()) for i in (0, 1)]
    assert [trial["status"] for trial in trials] == ["done", "done"]
    rates = [trial["params"]["optim.lr"] for trial in trials]
    assert all(0.01 <= rate <= 0.3 for rate in rates) and rates[0] != rates[1]
    assert "best trial:" in first.stdout and (sweep_dir / "results.md").read_text().count("| done |") == 2
    again = run(command)
    assert again.stdout.count("done before, not trained again") == 2


def test_a_second_launch_on_a_run_dir_in_use_is_refused_naming_the_holder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    holder = lock_run_dir(run_dir)  # this test process plays the first job
    try:
        with pytest.raises(LaunchError, match=r"run dir .*run is in use by \S+ pid \d+ since 20"):
            lock_run_dir(run_dir)
        proc = run(["bash", "scripts/run_single.sh", f"RUN_DIR={run_dir}", *SMALL], expect_ok=False, timeout=120)
        assert proc.returncode == 2 and f"is in use by {socket.gethostname()} pid" in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and not (run_dir / "logs").exists(), "nothing of the second job ran"
    finally:
        os.close(holder)
    os.close(lock_run_dir(run_dir))  # released with its holder: never stale

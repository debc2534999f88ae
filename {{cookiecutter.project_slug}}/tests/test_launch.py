"""The launch layer (launch.py) in-process: keys, pass-through, sweeps, errors, the rendezvous checks."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from {{cookiecutter.package_name}} import launch as launch_module
from {{cookiecutter.package_name}}.launch import (
    KEYS,
    LaunchError,
    check_rendezvous,
    lock_run_dir,
    main,
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
from {{cookiecutter.package_name}}.rundir import (
    CONTROL_DIR_ENV,
    FAILED_MARKER,
    FINISHED_MARKER,
    STOPPED_MARKER,
    STORE_ADDRESS_ENV,
)

from .helpers import compose_config, free_port


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


@pytest.mark.parametrize(("preset", "expected"), [(None, "AUTO,STRICT"), ("COMPATIBLE", "COMPATIBLE")])
def test_launches_give_workers_alignment_independent_mkl_results(preset: str | None, expected: str) -> None:
    env = {key: value for key, value in os.environ.items() if key != "MKL_CBWR"}
    if preset:
        env["MKL_CBWR"] = preset  # the user's own choice wins
    assert worker_environment(env)["MKL_CBWR"] == expected


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


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (["GPUS=0,1", "NPROC_PER_NODE=4"], "nproc_per_node=4 but only 2 visible GPU(s)"),
        (["GPUS=0", "NPROC_PER_NODE=2"], "NCCL cannot put two ranks on one GPU"),
    ],
)
def test_gpus_key_is_checked_against_the_backend_before_torchrun(keys: list[str], message: str) -> None:
    launch = plan("single", parse_args(keys, "single"), {}, {})
    with pytest.raises(LaunchError, match=re.escape(message)):
        preflight(["task=classification", "data=synthetic", "model=small_cnn", "dist.backend=nccl"], None, launch)


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


def test_sync_batchnorm_on_several_cpu_processes_is_refused_before_torchrun(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a machine without GPUs, whatever this one has
    job = ["task=classification", "data=synthetic", "model=small_cnn", "ddp.sync_batchnorm=true"]
    with pytest.raises(LaunchError, match=r"^ddp.sync_batchnorm=true needs GPUs .* runs 2 processes on CPUs: drop it"):
        preflight(job, None, planned("single", "NPROC_PER_NODE=2"))
    preflight(job, None, planned("single", "NPROC_PER_NODE=1"))  # one process: nothing to sync with


@pytest.mark.parametrize(("overrides", "message"), [(["dist.backend=nccl"], "dist.backend=nccl needs a GPU"),
                                                    (["dist.timeout_s=0"], "dist.timeout_s must be > 0")])  # fmt: skip
def test_the_communication_check_refuses_a_bad_override_before_torchrun(monkeypatch, capsys, overrides, message):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    started = []
    monkeypatch.setattr(launch_module, "torchrun", lambda *args, **kwargs: started.append(args) or 0)
    with pytest.raises(SystemExit) as exited:
        main(["comm", "NPROC_PER_NODE=2", *overrides])
    assert exited.value.code == 2 and not started
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


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


def test_node_zero_refuses_a_master_port_in_use_before_torchrun() -> None:
    # In-process twin of tests/e2e/test_multinode.py's script test: check_rendezvous must ask for the port.
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        launch = planned("multi", "NODE_RANK=0", f"MASTER_PORT={port}", "NPROC_PER_NODE=1")
        with pytest.raises(LaunchError, match=f"MASTER_PORT={port} is already in use on this machine"):
            check_rendezvous(launch)


def test_other_nodes_wait_for_node_zero_a_bounded_time_then_give_a_hint() -> None:
    port = free_port()  # nobody listens there
    launch = planned("multi", "NODE_RANK=1", "MASTER_ADDR=127.0.0.1", f"MASTER_PORT={port}", "WAIT_FOR_MASTER_S=1",
                     "NPROC_PER_NODE=1")  # fmt: skip
    started = time.monotonic()
    with pytest.raises(LaunchError) as error:
        check_rendezvous(launch)
    assert f"node 0 is not reachable at 127.0.0.1:{port} after 1 s" in str(error.value)
    assert f"nc -zv 127.0.0.1 {port}" in str(error.value) and time.monotonic() - started < 15


def test_a_run_dir_is_held_by_one_launch_at_a_time_and_freed_with_its_holder(tmp_path: Path) -> None:
    holder = lock_run_dir(tmp_path / "run")
    me = f"{socket.gethostname()} pid {os.getpid()}"
    try:
        with pytest.raises(LaunchError, match=rf"is in use by {re.escape(me)} since"):
            lock_run_dir(tmp_path / "run")
    finally:
        os.close(holder)
    os.close(lock_run_dir(tmp_path / "run"))


def test_a_refused_launch_exits_2_with_one_line_and_leaves_no_run_dir(tmp_path: Path, monkeypatch, capsys) -> None:
    # The launcher's main() in-process: what the launch scripts' refusals (tests/e2e/) see, without their seconds.
    monkeypatch.chdir(tmp_path)  # run dirs are made under ./outputs
    with pytest.raises(SystemExit) as exited:
        main(["single", "NPROC_PER_NODE=2", "task=classification", "data=synthetic", "data.batch_size=0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: data.batch_size must be a whole number >= 1, got 0\n", err
    assert not (tmp_path / "outputs").exists(), "a refused launch must not create a run dir"


@pytest.mark.parametrize(("mode", "signum"), [("single", signal.SIGTERM), ("single", signal.SIGINT),
                                              ("single", signal.SIGHUP), ("comm", signal.SIGTERM)])  # fmt: skip
def test_a_signal_during_the_checks_stops_the_launch_before_torchrun(monkeypatch, capsys, tmp_path, mode, signum):
    monkeypatch.chdir(tmp_path)
    real_popen = subprocess.Popen

    def no_torchrun(command, *args, **kwargs):
        assert not any(str(part).endswith(".agent") for part in command), "torchrun started"
        return real_popen(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", no_torchrun)
    name = "preflight" if mode == "single" else "check_comm_config"
    checks = getattr(launch_module, name)

    def interrupted_checks(*args, **kwargs):  # the signal arrives while the launcher still checks
        os.kill(os.getpid(), signum)
        return checks(*args, **kwargs)

    monkeypatch.setattr(launch_module, name, interrupted_checks)
    code = main([mode, "NPROC_PER_NODE=1", "task=classification", "data=synthetic", "model=small_cnn"])
    assert code == 128 + signum, "nothing was trained"
    name = signal.Signals(signum).name
    assert capsys.readouterr().err == f"stopped by {name} before torchrun started: nothing was trained\n"
    assert not (tmp_path / "outputs").exists(), "no run dir for a launch that never started"


@pytest.mark.parametrize(
    ("markers", "torchrun_code", "signalled", "code", "said"),
    [
        ({FINISHED_MARKER: "48\n"}, 143, signal.SIGTERM, 0, "training had finished when SIGTERM came"),
        ({STOPPED_MARKER: "1\n"}, 1, 0, 129, ""),  # SIGHUP sent to torchrun itself, not to the launcher
        ({FAILED_MARKER: "nodes differ\n2\n"}, 1, 0, 2, "error: nodes differ (the traceback: "),
        ({FAILED_MARKER: ""}, 1, 0, 1, "error: a worker stopped the job without saying why"),
        ({}, 143, signal.SIGTERM, 143, ""),
    ],
)
def test_the_jobs_exit_code_follows_what_the_workers_said(tmp_path, capsys, markers, torchrun_code, signalled, code,
                                                          said) -> None:  # fmt: skip
    control, run_dir = tmp_path / "control", tmp_path / "run"
    control.mkdir()
    for name, text in markers.items():
        (control / name).write_text(text)
    forwarder = launch_module.Forwarder()
    forwarder.signal = signalled
    try:
        assert launch_module.job_exit_code(torchrun_code, run_dir, control, forwarder) == code
    finally:
        forwarder.close()
    printed = capsys.readouterr()
    assert said in printed.out + printed.err


def test_a_job_on_one_node_listens_on_loopback_only() -> None:
    single = planned("single", "NPROC_PER_NODE=2")
    assert single.env[STORE_ADDRESS_ENV] == "127.0.0.1" and single.env["GLOO_SOCKET_IFNAME"] == "lo"
    assert planned("single", environ={"GLOO_SOCKET_IFNAME": "eth1"}).env["GLOO_SOCKET_IFNAME"] == "eth1", "the user's"
    multi = planned("multi", "NODE_RANK=0", "MASTER_ADDR=127.0.0.1", "LOCAL_ADDR=127.0.0.1")
    assert multi.env[STORE_ADDRESS_ENV] == "127.0.0.1", "many nodes: the node's own address, when given"
    assert STORE_ADDRESS_ENV not in planned("multi", "NODE_RANK=0", "MASTER_ADDR=127.0.0.1").env


def test_run_dir_is_resolved_as_the_workers_resolve_it_and_refused_when_a_file(tmp_path: Path) -> None:
    cfg = launch_module.compose_train_config(["task=classification", "seed=7"])
    assert launch_module.resolved_run_dir(tmp_path / "run_${seed}", cfg) == tmp_path / "run_7"
    assert launch_module.resolved_run_dir(None, cfg) is None
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(LaunchError, match=r"RUN_DIR=.*notes.txt is a file, not a run dir: give a folder"):
        launch_module.resolved_run_dir(tmp_path / "notes.txt", cfg)
    with pytest.raises(LaunchError, match=r"RUN_DIR=.*\$\{nope\}"):
        launch_module.resolved_run_dir(tmp_path / "run_${nope}", cfg)


def test_more_processes_than_memory_holds_are_refused_and_more_than_cores_warned(monkeypatch, capsys) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    job = ["task=classification", "data=synthetic", "model=small_cnn"]
    monkeypatch.setattr(launch_module, "available_memory", lambda: 3 * 2**30)
    refused = r"^NPROC_PER_NODE=64 would need about \d+\.\d GiB \(64 processes .* 3.0 GiB available: start at most \d+ "
    with pytest.raises(LaunchError, match=refused):
        preflight(job, None, planned("single", "NPROC_PER_NODE=64"))
    monkeypatch.setattr(launch_module, "available_memory", lambda: 64 * 2**30)
    monkeypatch.setattr(launch_module, "too_many_for_the_cores", lambda nproc, on_gpus: f"warning: {nproc} on cores")
    preflight(job, None, planned("single", "NPROC_PER_NODE=3"))
    assert capsys.readouterr().err == "warning: 3 on cores\n"


def test_a_relaunch_with_overrides_the_checkpoint_cannot_take_is_refused_before_torchrun(tmp_path: Path) -> None:
    """The multi-node case of a run name used again: what a finished or half-done run's checkpoint says."""
    import torch

    from {{cookiecutter.package_name}}.config import to_plain_dict, to_train_config

    job = ["task=classification", "data=synthetic", "model=small_cnn", "trainer.epochs=2", "data.train_size=1024"]
    plain = to_plain_dict(to_train_config(compose_config(job)))
    for epoch, samples, overrides, refusal in [
        (2, 0, ["optim.lr=0.01"], r"has finished \(epoch 2 of 2, step 32\) and would train nothing"),
        (1, 512, ["data.train_size=4096"], r"another sample order or data set \(data.train_size: checkpoint 1024"),
    ]:
        run_dir = tmp_path / f"run_{epoch}"
        (run_dir / "checkpoints").mkdir(parents=True)
        payload = {"format_version": 1, "model": {}, "optimizer": {}, "step": 32, "epoch": epoch,
                   "samples_in_epoch": samples, "config": plain}  # fmt: skip
        torch.save(payload, run_dir / "checkpoints" / "step_00000032.pt")
        with pytest.raises(LaunchError, match=refusal):
            preflight([*job, *overrides], run_dir, planned("single", "NPROC_PER_NODE=2"))
        preflight(job, run_dir, planned("single", "NPROC_PER_NODE=2"))  # as launched before: fine


SWEEP_JOB = ["task=classification", "data=synthetic", "model=small_cnn", "data.train_size=64", "data.val_size=16"]


def quick_jobs(calls: list[list[str]], code: int = 0):
    """torchrun's stand-in for sweeps: a point's job ends at once, leaving what a finished one leaves (its final
    validation, val_loss = its learning rate; the finished marker), or exiting `code`."""

    def torchrun(launch, module, arguments, forwarder, failed=None) -> int:
        run_dir = Path(arguments[0].split("=", 1)[1].strip("'"))
        calls.append(arguments[1:])
        lr = float(next((item.split("=")[1] for item in arguments if item.startswith("optim.lr=")), "0.1"))
        record = {"kind": "val", "step": 2, "epoch": 0, "val_loss": lr, "val_acc": 0.5, "val_samples": 16}
        (run_dir / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        if code == 0:
            (Path(launch.env[CONTROL_DIR_ENV]) / FINISHED_MARKER).write_text("2\n")
        return code

    return torchrun


def test_a_sweep_runs_each_point_once_in_its_own_run_dir_and_tabulates_them(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    calls: list[list[str]] = []
    monkeypatch.setattr(launch_module, "torchrun", quick_jobs(calls))
    sweep_dir = tmp_path / "sweep"
    command = ["single", "NPROC_PER_NODE=1", f"SWEEP_DIR={sweep_dir}", "-m", "optim.lr=0.1,-1,0.05", *SWEEP_JOB]
    assert main(list(command)) == 1, "a failed point makes the sweep's exit code 1"
    assert calls == [["optim.lr=0.1", *SWEEP_JOB], ["optim.lr=0.05", *SWEEP_JOB]], "the refused point never started"
    points = sorted(path.name for path in sweep_dir.iterdir() if path.is_dir())
    assert points == ["000_optim.lr=0.1", "001_optim.lr=-1", "002_optim.lr=0.05"]
    status = [json.loads((sweep_dir / name / "sweep_point.json").read_text()) for name in points]
    assert [row["status"] for row in status] == ["done", "failed", "done"]
    assert status[1]["reason"].startswith("optim.lr must be a number > 0") and status[0]["final"]["val_loss"] == 0.1
    table = (sweep_dir / "results.md").read_text().splitlines()
    assert table[0] == "| point | overrides | status | val_loss | val_acc | val_samples |"
    assert table[2:] == ["| 0 | optim.lr=0.1 | done | 0.1 | 0.5 | 16 |",
                         "| 1 | optim.lr=-1 | failed (optim.lr must be a number > 0, got -1) |  |  |  |",
                         "| 2 | optim.lr=0.05 | done | 0.05 | 0.5 | 16 |"]  # fmt: skip
    capsys.readouterr()
    calls.clear()
    assert main(list(command)) == 1
    assert calls == [], "the points that finished are not trained again (and the refused one is refused again)"
    assert capsys.readouterr().out.count("done before, not trained again") == 2


def test_a_sweep_stops_at_the_point_a_signal_stopped(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[list[str]] = []
    monkeypatch.setattr(launch_module, "torchrun", quick_jobs(calls, code=128 + signal.SIGTERM))
    monkeypatch.setattr(launch_module.Forwarder, "stopped_before_start", lambda self: None)
    original = launch_module.Forwarder.__init__

    def signalled(self) -> None:  # the stop signal came during the first point's job
        original(self)
        self.signal = signal.SIGTERM

    monkeypatch.setattr(launch_module.Forwarder, "__init__", signalled)
    sweep_dir = tmp_path / "sweep"
    code = main(["single", "NPROC_PER_NODE=1", f"SWEEP_DIR={sweep_dir}", "-m", "optim.lr=0.1,0.05", *SWEEP_JOB])
    assert code == 143 and len(calls) == 1, "the second point never starts"
    assert f"sweep stopped by a signal: launch again with SWEEP_DIR={sweep_dir} to continue" in capsys.readouterr().out
    assert json.loads((sweep_dir / "000_optim.lr=0.1" / "sweep_point.json").read_text())["status"] == "stopped"
    assert not (sweep_dir / "results.md").exists()


def test_an_optuna_sweep_asks_its_sampler_for_each_trial_and_names_the_best(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    calls: list[list[str]] = []
    monkeypatch.setattr(launch_module, "torchrun", quick_jobs(calls))
    space = ["hydra/sweeper=optuna", "hydra.sweeper.n_trials=3", "hydra.sweeper.direction=maximize",
             "optim.lr=tag(log,interval(0.01,0.3))", "optim.momentum=choice(0.8,0.9)"]  # fmt: skip
    command = ["single", "NPROC_PER_NODE=1", f"SWEEP_DIR={tmp_path / 'sweep'}", "-m", *space, *SWEEP_JOB]
    assert main(list(command)) == 0
    trials = [json.loads((tmp_path / "sweep" / f"00{i}_trial" / "sweep_point.json").read_text()) for i in range(3)]
    rates = [trial["params"]["optim.lr"] for trial in trials]
    assert all(0.01 <= rate <= 0.3 for rate in rates) and len(set(rates)) == 3
    assert {trial["params"]["optim.momentum"] for trial in trials} <= {0.8, 0.9}
    best = max(range(3), key=lambda i: rates[i])  # val_loss is the rate here, and the direction maximize
    assert f"best trial: {best} (" in capsys.readouterr().out
    calls.clear()
    assert main(list(command)) == 0 and calls == [], "finished trials are told to the study again, not rerun"
    with pytest.raises(SystemExit) as refused:
        main(["single", "-m", "hydra/sweeper=optuna", *SWEEP_JOB])
    assert refused.value.code == 2 and "found no search space" in capsys.readouterr().err

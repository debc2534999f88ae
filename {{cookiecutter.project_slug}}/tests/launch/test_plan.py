"""launch/plan.py: what torchrun is given and what the workers' environment holds (threads, MKL,
loopback, DEBUG=1's switches, the rendezvous of many nodes and the keys' bounds)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.common.run_dir import DEBUG_DIR_ENV, STORE_ADDRESS_ENV
from {{cookiecutter.package_name}}.launch import plan as plan_module
from {{cookiecutter.package_name}}.launch.keys import LaunchError, parse_args
from {{cookiecutter.package_name}}.launch.plan import (
    cpu_cores,
    debug_dir_environment,
    interface_of,
    plan,
    worker_environment,
)

from ..helpers import planned


def test_torchrun_flags_after_the_separator_reach_torchrun() -> None:
    launch = planned("single", "NPROC_PER_NODE=2", "--", "--log-dir=/tmp/x", "--local-ranks-filter=0")
    assert launch.torchrun_args == ["--standalone", "--nproc-per-node=2", "--max-restarts=3", "--log-dir=/tmp/x",
                                    "--local-ranks-filter=0"]  # fmt: skip


def test_workers_get_one_thread_exact_mkl_and_a_shutdown_grace_for_the_checkpoint() -> None:
    launch = planned("single", "SHUTDOWN_TIMEOUT_S=115")
    assert launch.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "115"
    assert worker_environment({}) == {"OMP_NUM_THREADS": "1", "MKL_CBWR": "AUTO,STRICT"}
    assert worker_environment({"OMP_NUM_THREADS": "4"})["OMP_NUM_THREADS"] == "4"


def test_on_cpus_one_process_gets_every_core_and_processes_asked_for_share_them(monkeypatch) -> None:
    every = os.sched_getaffinity(0)
    assert cpu_cores() == len(every), "the cores this launch may run on"
    os.sched_setaffinity(0, {min(every)})  # as taskset or a cpuset leaves it
    try:
        assert cpu_cores() == 1
    finally:
        os.sched_setaffinity(0, every)
    with monkeypatch.context() as elsewhere:  # a system without affinities: the machine's count, or 1
        elsewhere.delattr(os, "sched_getaffinity")
        elsewhere.setattr(os, "cpu_count", lambda: 6)
        assert cpu_cores() == 6
        elsewhere.setattr(os, "cpu_count", lambda: None)
        assert cpu_cores() == 1
    monkeypatch.setattr(plan_module, "cpu_cores", lambda: 8)
    chosen = planned("single")  # no GPU (planned hides them), no count asked for: one process, every core
    assert chosen.nproc == 1 and "--nproc-per-node=1" in chosen.torchrun_args
    assert chosen.values["NPROC_PER_NODE"] == "1" and chosen.env["OMP_NUM_THREADS"] == "8"
    for asked in (planned("single", "NPROC_PER_NODE=2"), planned("single", environ={"NPROC_PER_NODE": "2"})):
        assert asked.nproc == 2 and "--nproc-per-node=2" in asked.torchrun_args, "a user who asks gets them"
        assert asked.env["OMP_NUM_THREADS"] == "4", "the cores split among the processes"
    assert planned("single", "NPROC_PER_NODE=16").env["OMP_NUM_THREADS"] == "1", "at least one each"
    assert planned("single", environ={"OMP_NUM_THREADS": "3"}).env["OMP_NUM_THREADS"] == "3", "the user's own"


def test_with_gpus_one_process_per_gpu_of_one_thread(monkeypatch) -> None:
    monkeypatch.setattr(plan_module, "cpu_cores", lambda: 8)
    visible = planned("single", environ={"CUDA_VISIBLE_DEVICES": "0,1,2"})
    assert visible.nproc == 3 and visible.env["OMP_NUM_THREADS"] == "1"
    listed = planned("single", "GPUS=4,5")
    assert listed.nproc == 2 and listed.env["OMP_NUM_THREADS"] == "1" and listed.env["CUDA_VISIBLE_DEVICES"] == "4,5"


@pytest.mark.parametrize(("preset", "expected"), [(None, "AUTO,STRICT"), ("COMPATIBLE", "COMPATIBLE")])
def test_launches_give_workers_alignment_independent_mkl_results(preset: str | None, expected: str) -> None:
    env = {key: value for key, value in os.environ.items() if key != "MKL_CBWR"}
    if preset:
        env["MKL_CBWR"] = preset  # the user's own choice wins
    assert worker_environment(env)["MKL_CBWR"] == expected


def test_a_job_on_one_node_listens_on_loopback_only(monkeypatch) -> None:
    single = planned("single", "NPROC_PER_NODE=2")
    assert single.env[STORE_ADDRESS_ENV] == "127.0.0.1" and single.env["GLOO_SOCKET_IFNAME"] == "lo"
    with monkeypatch.context() as no_ip_command:  # `ip` missing: Linux's name for loopback
        no_ip_command.setattr(plan_module, "interface_of", lambda address: None)
        assert planned("single").env["NCCL_SOCKET_IFNAME"] == "lo"
    assert planned("single", environ={"GLOO_SOCKET_IFNAME": "eth1"}).env["GLOO_SOCKET_IFNAME"] == "eth1", "the user's"
    multi = planned("multi", "NODE_RANK=0", "MASTER_ADDR=127.0.0.1", "LOCAL_ADDR=127.0.0.1")
    assert multi.env[STORE_ADDRESS_ENV] == "127.0.0.1", "many nodes: the node's own address, when given"
    assert STORE_ADDRESS_ENV not in planned("multi", "NODE_RANK=0", "MASTER_ADDR=127.0.0.1").env


def test_debug_1_gives_the_workers_the_switches_and_leaves_the_users_own(monkeypatch, tmp_path: Path) -> None:
    launch = plan("single", parse_args(["DEBUG=1", "NPROC_PER_NODE=1"], "single"), {"NCCL_DEBUG": "TRACE"}, {})
    assert launch.env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL" and launch.env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert launch.env["NCCL_DEBUG"] == "TRACE", "a value the user set wins"
    assert plan("single", parse_args(["DEBUG=1", "NPROC_PER_NODE=1"], "single"), {}, {}).env["NCCL_DEBUG"] == "INFO"
    # NCCL's flight recorder keeps each rank's last 2000 collectives, under the name this torch reads (2.11 renamed it)
    assert launch.env["TORCH_FR_BUFFER_SIZE"] == "2000" and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in launch.env
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.10.1+cpu")
    older = plan("single", parse_args(["DEBUG=1", "NPROC_PER_NODE=1"], "single"), {}, {}).env
    assert older["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000" and "TORCH_FR_BUFFER_SIZE" not in older
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.11.0")
    assert "TORCH_FR_BUFFER_SIZE" in plan("single", parse_args(["DEBUG=1", "NPROC_PER_NODE=1"], "single"), {}, {}).env
    monkeypatch.undo()
    assert "TORCH_DISTRIBUTED_DEBUG" not in plan("single", parse_args(["NPROC_PER_NODE=1"], "single"), {}, {}).env
    with pytest.raises(LaunchError, match="DEBUG=yes: give DEBUG=1"):
        plan("single", parse_args(["DEBUG=yes", "NPROC_PER_NODE=1"], "single"), {}, {})
    files = debug_dir_environment(tmp_path / "debug", {})  # known once the run dir is: in train()
    assert files["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == f"{tmp_path}/debug/nccl_trace_rank_"
    assert files["NCCL_DEBUG_FILE"] == f"{tmp_path}/debug/nccl_%h_%p.log"
    assert debug_dir_environment(tmp_path, {"NCCL_DEBUG_FILE": "/mine.log"})["NCCL_DEBUG_FILE"] == "/mine.log"
    assert files[DEBUG_DIR_ENV] == f"{tmp_path}/debug"


def test_no_restarts_and_no_shutdown_grace_are_choices() -> None:
    none = planned("single", "MAX_RESTARTS=0", "SHUTDOWN_TIMEOUT_S=0")
    assert "--max-restarts=0" in none.torchrun_args and none.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "0"


def test_a_node_of_a_job_of_fixed_size_gets_torchruns_rendezvous_and_a_run_named_after_it() -> None:
    node = planned("multi", "NODE_RANK=1", "NNODES=3", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=65535")
    assert node.torchrun_args[-4:] == ["--nnodes=3", "--node-rank=1", "--master-addr=127.0.0.1", "--master-port=65535"]
    assert node.values["RUN_NAME"] == "multi_127.0.0.1_65535", "the same run dir on every node, untyped"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in node.env
    named = planned("multi", "NODE_RANK=0", "MASTER_ADDR=127.0.0.1", "RUN_NAME=Run 1/a.b-c_d")
    assert named.values["RUN_NAME"] == "Run_1_a.b-c_d", "a name one folder can have"
    first = planned("multi", "NODE_RANK=0")  # node 0 without MASTER_ADDR: its own name
    assert first.values["MASTER_ADDR"] == socket.gethostname()
    assert f"--master-addr={socket.gethostname()}" in first.torchrun_args


def test_an_elastic_job_meets_at_node_zeros_c10d_rendezvous_with_a_fresh_store_each_round() -> None:
    host = planned("multi", "NODE_RANK=0", "NNODES=1:3", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29400",
                   "RDZV_LAST_CALL_S=0", "RDZV_HEARTBEAT_S=2")  # fmt: skip
    assert host.torchrun_args[-5:] == [
        "--nnodes=1:3", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400", "--rdzv-id=multi_127.0.0.1_29400",
        "--rdzv-conf=is_host=1,last_call_timeout=0,keep_alive_interval=2,keep_alive_max_attempt=3",
    ]  # fmt: skip
    assert host.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    other = planned("multi", "NODE_RANK=2", "NNODES=3:3", "MASTER_ADDR=127.0.0.1", "RDZV_LAST_CALL_S=7")
    conf = "--rdzv-conf=is_host=0,last_call_timeout=7,keep_alive_interval=5,keep_alive_max_attempt=3"
    assert other.torchrun_args[-1] == conf, "torchrun's own heartbeat unless RDZV_HEARTBEAT_S is given"


def test_a_nodes_own_address_is_where_its_stores_listen_and_names_gloos_and_ncclss_interface(monkeypatch) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")  # the user's own wins
    node = planned("multi", "NODE_RANK=0", "MASTER_ADDR=127.0.0.1", "LOCAL_ADDR=127.0.0.1")
    assert "--local-addr=127.0.0.1" in node.torchrun_args
    assert node.env["GLOO_SOCKET_IFNAME"] == "lo" and node.env["NCCL_SOCKET_IFNAME"] == "ib0"


@pytest.mark.parametrize(("keys", "error"), [
    ([], "NODE_RANK is required: NODE_RANK=0 on the first node, 1, 2, ... on the others"),
    (["NODE_RANK=0", "MASTER_PORT=65536"], "MASTER_PORT=65536 is outside 1..65535"),
    (["NODE_RANK=0", "NNODES=0:2"], "NNODES=0:2: MIN must be at least 1"),
    (["NODE_RANK=0", "NNODES=3:2"], "NNODES=3:2: MIN is larger than MAX; give NNODES=MIN:MAX with MIN <= MAX"),
    (["NODE_RANK=0", "WAIT_FOR_NODES_S=0"], "WAIT_FOR_NODES_S=0 must be at least 1"),
    (["NODE_RANK=0", "NNODES=1:2", "RDZV_HEARTBEAT_S=0"], "RDZV_HEARTBEAT_S=0 must be at least 1"),
    (["NODE_RANK=0", "MASTER_ADDR=nowhere.invalid"], "MASTER_ADDR=nowhere.invalid does not resolve on this machine: "
     "give node 0's address as every node can reach it (an IP address, or a name in DNS or /etc/hosts)"),
])  # fmt: skip
def test_many_nodes_keys_outside_their_bounds_are_refused_in_one_line(keys: list[str], error: str) -> None:
    address = [] if any(key.startswith("MASTER_ADDR=") for key in keys) else ["MASTER_ADDR=127.0.0.1"]
    with pytest.raises(LaunchError) as refused:
        planned("multi", *keys, *address)
    assert str(refused.value) == error


def test_many_nodes_keys_at_their_bounds_are_taken() -> None:
    launch = planned("multi", "NODE_RANK=0", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1", "NNODES=1:1",
                     "WAIT_FOR_MASTER_S=0", "WAIT_FOR_NODES_S=1", "RDZV_LAST_CALL_S=0",
                     "RDZV_HEARTBEAT_S=1")  # fmt: skip
    conf = "--rdzv-conf=is_host=1,last_call_timeout=0,keep_alive_interval=1,keep_alive_max_attempt=3"
    assert launch.torchrun_args[-1] == conf


def test_an_address_is_found_on_its_own_interface_and_nowhere_else(monkeypatch) -> None:
    listing = (  # `ip -o -4 addr show`, with a short line and an interface of no options
        "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n"
        "4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever\n"
        "5: odd inet\n"
        "6: wg0 inet 10.9.9.9/32\n"
    )
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: subprocess.CompletedProcess(args, 0, listing, ""))
    assert [interface_of(address) for address in ("192.0.2.2", "127.0.0.1", "10.9.9.9")] == ["eth0", "lo", "wg0"]
    assert interface_of("198.51.100.7") is None

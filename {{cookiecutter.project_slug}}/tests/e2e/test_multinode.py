"""Several nodes, played by several run_multi.sh processes on this machine (and in network namespaces)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..helpers import PROJECT_DIR, SMALL, free_port, job_env, run
from .jobs import fingerprints, finish_nodes, kill_node, node, read_metrics, steps_saved, wait_for, wait_for_file

JOB = [*SMALL, "trainer.epochs=1", "data.train_size=512", "data.val_size=200"]


# The three below start the launch script and stop before torchrun, several seconds each: in the slow set,
# as tests/launch/ checks the same refusals in-process (test_rendezvous.py, test_keys.py).
@pytest.mark.slow
def test_bad_input_is_refused_before_torchrun() -> None:
    # Every case is checked in-process by tests/launch/test_keys.py; here one goes through the script.
    proc = run(["bash", "scripts/run_multi.sh", "NODE_RANK=2", "NNODES=2"], expect_ok=False, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "NODE_RANK=2 is outside 0..1 for NNODES=2" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert "torch.distributed" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_node_zero_refuses_a_taken_port() -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run(["bash", "scripts/run_multi.sh", "NODE_RANK=0", f"MASTER_PORT={port}", *SMALL], expect_ok=False)
    assert proc.returncode == 2
    assert f"MASTER_PORT={port} is already in use on this machine" in proc.stderr


@pytest.mark.slow
def test_other_nodes_wait_for_the_master_then_give_a_hint() -> None:
    port = free_port()
    started = time.monotonic()
    proc = run(["bash", "scripts/run_multi.sh", "NODE_RANK=1", "MASTER_ADDR=127.0.0.1", f"MASTER_PORT={port}",
                "WAIT_FOR_MASTER_S=2", *SMALL], expect_ok=False)  # fmt: skip
    assert proc.returncode == 2
    assert f"node 0 is not reachable at 127.0.0.1:{port} after 2 s" in proc.stderr
    assert f"nc -zv 127.0.0.1 {port}" in proc.stderr
    assert time.monotonic() - started < 30


@pytest.mark.slow
def test_nodes_launched_with_other_overrides_stop_together_in_one_line() -> None:
    port, run_name = free_port(), f"differ_{uuid.uuid4().hex[:8]}"
    nodes = [node(0, port, f"RUN_NAME={run_name}", *JOB), node(1, port, f"RUN_NAME={run_name}", *JOB, "optim.lr=0.01")]
    try:
        for proc in nodes:
            output, _ = proc.communicate(timeout=240)
            assert proc.returncode == 2, output[-3000:]
            assert (
                "error: the nodes were launched with different settings (node 1: optim.lr=0.01 where node 0 has 0.1): "
                f"launch every node with the same overrides (the traceback: outputs/{run_name}/logs/)"
            ) in output.splitlines(), output[-3000:]
            assert "Traceback" not in output
        assert not list((PROJECT_DIR / "outputs" / run_name).glob("checkpoints/step_*")), "nothing trained"
    finally:
        shutil.rmtree(PROJECT_DIR / "outputs" / run_name, ignore_errors=True)


# 32x32 images: steps slow enough that node 0 alone is still training when node 1 comes back. Heartbeats
# every 2 s: the killed node is dropped 6 s after its last one, not torchrun's 15.
ELASTIC = ["NNODES=1:2", "RDZV_HEARTBEAT_S=2", *SMALL, "data.image_size=32", "trainer.epochs=3", "data.train_size=2048",
           "checkpoint.every_n_steps=10"]  # fmt: skip


@pytest.mark.slow
def test_an_elastic_job_goes_on_without_a_killed_node_and_takes_it_back_when_it_is_launched_again() -> None:
    """NNODES=1:2: two nodes train; one is killed outright, and the other's torchrun restarts its worker
    alone, resuming the checkpoint two processes saved; the killed node launched again joins, and both
    restart together from the checkpoint one process saved. Both end with the same weights."""
    port, run_name = free_port(), f"elastic_{uuid.uuid4().hex[:8]}"
    run_dir = PROJECT_DIR / "outputs" / run_name
    first = node(0, port, f"RUN_NAME={run_name}", *ELASTIC)
    second = node(1, port, f"RUN_NAME={run_name}", *ELASTIC)
    try:
        wait_for_file("checkpoints/step_00000010.pt", run_dir)
        kill_node(second)
        left = r"resumed from \S+step_(\d+)\.pt.*\(saved by 2 processes, now 1\)"
        wait_for(lambda: re.search(left, (run_dir / "logs" / "rank_0.log").read_text()) is not None,
                 "node 0 going on alone", timeout=120)  # fmt: skip
        resumed = int(re.search(left, (run_dir / "logs" / "rank_0.log").read_text()).group(1))
        wait_for(lambda: max(steps_saved(run_dir)) > resumed, "a checkpoint of node 0 alone", timeout=120)
        again = node(1, port, f"RUN_NAME={run_name}", *ELASTIC)
        outputs = finish_nodes(first, again)
        log = (run_dir / "logs" / "rank_0.log").read_text()
        assert re.search(r"resumed from .*\(saved by 1 processes, now 2\)", log), log[-3000:]
        # Rank 0 says the final figures; the rendezvous after the node's return may give rank 0 to either node.
        assert any("final: val_loss=" in output for output in outputs), outputs[0][-3000:]
        prints = fingerprints(run_dir)
        assert set(prints) == {"rank_0", "rank_1"} and len(set(prints.values())) == 1, prints
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    return None


@pytest.fixture
def two_hosts() -> Iterator[tuple[list[list[str]], list[str]]]:
    """Two network namespaces joined by a veth pair: (the command prefix that runs in each, their addresses).
    Where they cannot be built (not root, no iproute2), two hosts on the loopback, said in the test's output."""
    if reason := netns_unavailable():
        print(f"two nodes on the loopback: {reason}")
        yield [[], []], ["127.0.0.1", "127.0.0.1"]
        return
    tag = uuid.uuid4().hex[:6]
    names, links = [f"ddpt{tag}a", f"ddpt{tag}b"], [f"vddp{tag}a", f"vddp{tag}b"]
    octet = 16 + int(tag[:2], 16) % 200  # a subnet of the test's own, only inside its namespaces
    addresses = [f"10.{octet}.77.1", f"10.{octet}.77.2"]
    commands = [["ip", "netns", "add", name] for name in names]
    commands.append(["ip", "link", "add", links[0], "type", "veth", "peer", "name", links[1]])
    for name, link, address in zip(names, links, addresses, strict=True):
        commands += [
            ["ip", "link", "set", link, "netns", name],
            ["ip", "-n", name, "addr", "add", f"{address}/24", "dev", link],
            ["ip", "-n", name, "link", "set", link, "up"],
            ["ip", "-n", name, "link", "set", "lo", "up"],
        ]
    try:
        for command in commands:
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                pytest.skip(f"cannot build network namespaces here: {' '.join(command)}: {result.stderr.strip()}")
        yield [["ip", "netns", "exec", name] for name in names], addresses
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)


@pytest.mark.slow
def test_two_static_nodes_over_a_real_address_train_together_and_resume_without_a_shared_filesystem(
    two_hosts, tmp_path: Path
) -> None:
    """Two static nodes, each in a network namespace of its own (over a real address, LOCAL_ADDR naming
    it) and each with its own disk: they train together (world size 2, the same weights on both), and a
    relaunch resumes from the checkpoint only node 0 holds, sent to node 1. (It was two tests: the
    namespaces, and the disks; each job's start costs seconds.) Two nodes on one shared disk, one run dir:
    the elastic test above."""
    prefixes, addresses = two_hosts
    projects = []
    for name in ("node0", "node1"):  # each node its own disk: a copy of the project
        shutil.copytree(PROJECT_DIR, tmp_path / name, ignore=shutil.ignore_patterns("outputs", "__pycache__"))
        projects.append(tmp_path / name)
    for epochs in (1, 2):
        port = free_port()
        common = ("RUN_NAME=shared_nothing", *JOB, f"trainer.epochs={epochs}")
        procs = []
        for rank, (prefix, project) in enumerate(zip(prefixes, projects, strict=True)):
            command = [*prefix, "bash", "scripts/run_multi.sh", f"NODE_RANK={rank}", f"MASTER_ADDR={addresses[0]}",
                       f"MASTER_PORT={port}", f"LOCAL_ADDR={addresses[rank]}", "NPROC_PER_NODE=1", *common]  # fmt: skip
            procs.append(subprocess.Popen(command, cwd=project, env=job_env(), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))  # fmt: skip
        outputs = finish_nodes(*procs)
        assert "world size 2" in outputs[0], outputs[0][-3000:]
    node0_dir, node1_dir = (project / "outputs" / "shared_nothing" for project in projects)
    assert not list((node1_dir / "checkpoints").glob("step_*.pt")), "only global rank 0 writes checkpoints"
    assert "received it from rank 0" in (node1_dir / "logs" / "rank_1.log").read_text()
    prints = {**fingerprints(node0_dir), **fingerprints(node1_dir)}
    assert set(prints) == {"rank_0", "rank_1"} and len(set(prints.values())) == 1, prints
    final = read_metrics(node0_dir)[-1]
    assert (final["kind"], final["epoch"]) == ("val", 1), final


@pytest.mark.slow
def test_node_zero_alone_says_what_it_waits_for_and_gives_up_in_bounded_time() -> None:
    port = free_port()
    started = time.monotonic()
    proc = run(["bash", "scripts/run_multi.sh", "NODE_RANK=0", "NNODES=2", "MASTER_ADDR=127.0.0.1",
                f"MASTER_PORT={port}", "NPROC_PER_NODE=1", "WAIT_FOR_NODES_S=5", *JOB], expect_ok=False)  # fmt: skip
    waited = time.monotonic() - started
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"waiting for all of NNODES=2 nodes to join at 127.0.0.1:{port}" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith("error: not all NNODES=2 nodes joined node 0's rendezvous")
    assert "Traceback" not in proc.stdout + proc.stderr and waited < 60, waited
    assert subprocess.run(["pgrep", "-f", f"MASTER_PORT={port}|master-port={port}"]).returncode == 1, "nothing left"


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_ctrl_c_while_node_zero_waits_for_the_others_stops_it_at_once_in_one_line() -> None:
    """A terminal's Ctrl-C (SIGINT to the launcher's process group) while torchrun's rendezvous waits for the other
    nodes: the job stops then, not once WAIT_FOR_NODES_S is over; one line, no traceback, and the run dir made for
    it goes."""
    port, run_name = free_port(), f"stopped_{uuid.uuid4().hex[:8]}"
    proc = node(0, port, "NNODES=2", f"RUN_NAME={run_name}", *JOB)
    try:
        wait_for(lambda: listening(port), "node 0's rendezvous store")
        os.killpg(proc.pid, signal.SIGINT)
        stopped = time.monotonic()
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130 and time.monotonic() - stopped < 10, output[-3000:]
        said = "stopped by SIGINT before training started: nothing was trained"
        assert output.strip().splitlines()[-1] == said, output[-3000:]
        assert "Traceback" not in output and not (PROJECT_DIR / "outputs" / run_name).exists(), output[-3000:]
    finally:
        if proc.poll() is None:
            kill_node(proc)
        shutil.rmtree(PROJECT_DIR / "outputs" / run_name, ignore_errors=True)

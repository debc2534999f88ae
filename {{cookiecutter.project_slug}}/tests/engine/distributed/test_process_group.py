"""engine/distributed/process_group.py: the helpers for a world of one and of two ranks, torchrun's variables read, the
weights' fingerprint, bytes sent between ranks, the agent's store per restart."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.distributed import process_group as distributed

from ...helpers import compose_config, on_ranks


def test_helpers_answer_for_a_world_of_one() -> None:
    assert distributed.get_rank() == 0 and distributed.get_world_size() == 1
    value = torch.tensor([3.0])
    assert distributed.all_reduce_sum(value).item() == 3.0
    assert distributed.all_gather_int(7, torch.device("cpu")) == [7]
    distributed.sync_buffers_from_rank_zero(nn.BatchNorm1d(3))  # nothing to sync with: a no-op


def buffers_after_sync(env) -> list[float]:
    """Each rank's BatchNorm statistics set to its rank, then synced: what the rank holds, and what it says it is."""
    norm = nn.BatchNorm1d(2)
    norm.running_mean.fill_(env.rank + 1.0)
    distributed.sync_buffers_from_rank_zero(norm)
    return [*norm.running_mean.tolist(), distributed.get_rank(), distributed.get_world_size()]


def test_every_rank_takes_rank_zeros_buffers() -> None:
    assert on_ranks(2, buffers_after_sync) == [[1.0, 1.0, 0, 2], [1.0, 1.0, 1, 2]]


def test_process_env_reads_torchruns_variables_or_answers_for_a_world_of_one(monkeypatch) -> None:
    config = to_train_config(compose_config()).dist
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.process_env(config, visible_gpus=0)[:4] == (0, 0, 1, 1)
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    rank, local_rank, world_size, local_world_size, choice = distributed.process_env(config, visible_gpus=0)
    assert (rank, local_rank, world_size, local_world_size) == (5, 1, 8, 4) and choice.backend == "gloo"
    assert distributed.process_env(config, visible_gpus=4)[4].backend == "nccl", "4 local ranks, 4 GPUs"
    if not torch.cuda.is_available():  # the GPUs torch sees, where none is said: none here
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # (one GPU would do for one local rank)
        assert distributed.process_env(config)[4].backend == "gloo"


def test_the_fingerprint_covers_every_bit_and_name_of_the_state() -> None:
    state = {"a.weight": torch.arange(6.0).reshape(2, 3), "a.bias": torch.zeros(2)}
    same = {name: tensor.clone() for name, tensor in reversed(list(state.items()))}
    assert distributed.weights_fingerprint(state) == distributed.weights_fingerprint(same), "not the order"
    flipped = {**same, "a.bias": torch.tensor([0.0, -0.0])}  # one bit: the sign of a zero
    renamed = {"b.weight" if name == "a.weight" else name: tensor for name, tensor in state.items()}
    prints = {distributed.weights_fingerprint(other) for other in (state, flipped, renamed)}
    assert len(prints) == 3 and all(len(value) == 64 for value in prints)


def send_bytes(env, payloads: list[bytes | None]) -> list[bytes]:
    """Each rank broadcasts in turn; what every rank received from each."""
    received = [distributed.broadcast_bytes(payloads[source] if env.rank == source else None, source, env.device)
                for source in range(env.world_size)]  # fmt: skip
    return received + distributed.all_gather_bytes(f"rank {env.rank}".encode() * (env.rank + 1), env.device)


def test_bytes_reach_every_rank_from_any_source() -> None:
    ranks = on_ranks(2, send_bytes, [b"checkpoint file", bytes(range(256))])
    assert ranks[0] == ranks[1] == [b"checkpoint file", bytes(range(256)), b"rank 0", b"rank 1rank 1"]
    ranks = on_ranks(2, send_bytes, [None, b""])  # a source with nothing to send: nothing arrives
    assert ranks[0][:2] == ranks[1][:2] == [b"", b""]


def test_each_torchrun_restart_gets_a_key_space_of_its_own_in_the_agents_store(monkeypatch) -> None:
    import datetime

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=10))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert distributed.restart_store(1, datetime.timedelta(seconds=10)) is None, "plain env:// without the agent's"
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    store = distributed.restart_store(1, datetime.timedelta(seconds=7))
    store.set("addr", "x")
    assert server.get("restart_2/addr") == b"x" and not server.check(["addr"])
    assert store.timeout == datetime.timedelta(seconds=7), "the job's dist.timeout_s, not the store's default"
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")  # the first generation, where torchrun leaves it unset
    distributed.restart_store(1, datetime.timedelta(seconds=10)).set("addr", "y")
    assert server.get("restart_0/addr") == b"y"


@pytest.mark.slow
def test_a_nodes_refusal_reaches_the_ranks_of_other_nodes_waiting_for_the_group(monkeypatch) -> None:
    """Node 1 refuses the job as it starts; node 0's ranks, waiting in init_process_group for it, read its
    line from the workers' store within a second (not after dist.timeout_s); once the group has formed,
    nothing is watched; on one node, nothing is."""
    import datetime
    import time

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=10))
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port), "GROUP_WORLD_SIZE": "2",
                        "GROUP_RANK": "1", "RANK": "2", "TORCHELASTIC_USE_AGENT_STORE": "True"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    heard: list[str] = []

    def waited_for(seconds: float) -> list[str]:
        deadline = time.monotonic() + seconds
        while not heard and time.monotonic() < deadline:
            time.sleep(0.05)
        return heard

    with distributed.refusals_of_other_nodes(heard.append):  # a rank of node 0 in init_process_group
        distributed.tell_the_other_nodes("data.root=x: no such folder")  # node 1's local rank 0
        assert waited_for(5) == ["node 1 refused the job: data.root=x: no such folder"]
    heard.clear()
    server.delete_key(distributed.REFUSED_KEY)
    with distributed.refusals_of_other_nodes(heard.append):
        pass  # the group formed: every node passed its checks
    distributed.tell_the_other_nodes("late")
    assert waited_for(1.5) == [], "the watch ended with the group formed"
    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")
    with distributed.refusals_of_other_nodes(heard.append):
        assert waited_for(1.5) == [], "one node: nothing to watch"
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")  # an elastic job's rank 0: the workers' store is its own, not up
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    monkeypatch.setenv("RANK", "0")
    server.delete_key(distributed.REFUSED_KEY)
    distributed.tell_the_other_nodes("mine")
    assert not server.check([distributed.REFUSED_KEY]), "not said to a store of its own that never started"


@pytest.mark.parametrize(
    ("agent_store", "rank", "group_world_size", "group_rank", "said"),
    [
        ("True", "0", "2", None, "node 0 refused the job: why"),  # node 0's own refusal, in the agent's store
        (None, "3", "2", "1", "node 1 refused the job: why"),  # a static job's rank: rank 0's store is up
        (None, None, "2", "0", None),  # no RANK: a rank 0 whose store of its own never started
        ("True", "2", None, "1", None),  # one node: nobody to tell
        ("True", "2", "1", "0", None),
    ],
)
def test_who_tells_the_other_nodes_of_a_refusal(monkeypatch, agent_store, rank, group_world_size, group_rank,
                                                 said) -> None:  # fmt: skip
    import datetime

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=10))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    for name, value in {"TORCHELASTIC_USE_AGENT_STORE": agent_store, "RANK": rank, "GROUP_WORLD_SIZE": group_world_size,
                        "GROUP_RANK": group_rank}.items():  # fmt: skip
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    distributed.tell_the_other_nodes("why")
    told = server.check([distributed.REFUSED_KEY])
    assert (server.get(distributed.REFUSED_KEY).decode() if told else None) == said


def test_the_store_client_joins_the_workers_store_as_a_client_or_answers_none(monkeypatch) -> None:
    import datetime

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=10))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    client = distributed.store_client(3)
    client.set("key", "from the client")
    assert server.get("key") == b"from the client" and client.timeout == datetime.timedelta(seconds=3)
    monkeypatch.delenv("MASTER_PORT")
    assert distributed.store_client(3) is None, "no store named: none"


def test_debug_detail_is_kept_off_ddp_on_gloo_where_it_crashes() -> None:
    before = dist.get_debug_level()
    try:
        dist.set_debug_level(dist.DebugLevel.DETAIL)
        distributed.keep_ddp_working_on_gloo("nccl")
        assert dist.get_debug_level() == dist.DebugLevel.DETAIL
        distributed.keep_ddp_working_on_gloo("gloo")
        assert dist.get_debug_level() == dist.DebugLevel.INFO
    finally:
        dist.set_debug_level(before)

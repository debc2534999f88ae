"""engine/checkpoint/store.py, against a real S3 API on 127.0.0.1 (moto's server): a checkpoint goes
up whole, a resume on an empty disk brings the newest whole one down, pruning happens there too, and
a store that stops answering is retried for a bounded time, then one line says what the store holds.
In this process's memory (fsspec's memory://): rank 0 waits for the other ranks' shards before it makes
a folder whole, as long as they take to come up, for checkpoint.store_retry_s at most; the local
checkpoints and the store are one history (the newest of either resumed); a checkpoint.dir belongs to
one run (tests/engine/checkpoint/test_owner.py's test, with a store)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError, JobError
from {{cookiecutter.package_name}}.common.object_store import check_reachable
from {{cookiecutter.package_name}}.config import CheckpointConfig
from {{cookiecutter.package_name}}.engine.checkpoint.files import checkpoint_store
from {{cookiecutter.package_name}}.engine.checkpoint.store import CheckpointStore
from {{cookiecutter.package_name}}.engine.checkpoint.writer import Checkpointer

from .test_owner import owned_by_the_first_run, state


def config(url: str, keep_last: int = 2, retry_s: float = 1.0) -> CheckpointConfig:
    return CheckpointConfig(every_n_steps=1, keep_last=keep_last, resume="auto", allow_changes=[], dir=url,
                            store_retry_s=retry_s)  # fmt: skip


@pytest.mark.slow
def test_checkpoints_go_up_whole_are_pruned_there_and_come_down_to_an_empty_disk(s3_server, tmp_path: Path) -> None:
    url = f"{s3_server.bucket()}/runs/a"
    check_reachable(url, "checkpoint.dir")  # what the launcher asks before torchrun (tests/common/test_object_store.py)
    with pytest.raises(ConfigError, match="^checkpoint.dir=s3://no-such-bucket/a: the store does not answer"):
        check_reachable("s3://no-such-bucket/a", "checkpoint.dir")
    writer = Checkpointer(tmp_path / "node0", config(url), is_writer=True)
    for step in (1, 2, 3):
        assert writer.save(step, state(step))
        writer.wait()
    store = CheckpointStore(url, retry_s=1.0)
    assert store.names() == ["step_00000003.pt", "step_00000002.pt"], "keep_last=2, pruned in the store too"
    # A folder of shards whose upload a kill cut short (no trainer.pt) is never taken, and goes with pruning.
    fs = s3_server.filesystem()
    fs.pipe(f"{url.removeprefix('s3://')}/step_00000009/__0_0.distcp", b"cut")
    fs.pipe(f"{url.removeprefix('s3://')}/step_00000001/__0_0.distcp", b"old and cut")
    assert store.names()[0] == "step_00000003.pt"
    store.prune(2)
    store.prune(1, keep={"step_00000002.pt"})  # checkpoint.keep_best's: kept apart from keep_last there too
    assert store.names() == ["step_00000003.pt", "step_00000002.pt"]
    assert not fs.exists(f"{url.removeprefix('s3://')}/step_00000001"), "a cut folder below the kept ones goes"
    assert fs.exists(f"{url.removeprefix('s3://')}/step_00000009"), "one above may be an upload under way"

    fresh = Checkpointer(tmp_path / "another_node", config(url), is_writer=True)  # an empty local disk
    path, payload = fresh.find_resume_payload()
    assert path == tmp_path / "another_node" / "step_00000003.pt" and payload["step"] == 3
    assert torch.equal(payload["model"]["w"], torch.full((3,), 3.0))
    assert not list((tmp_path / "another_node").glob(".tmp_*")), "downloads are renamed into place once whole"
    other_rank = Checkpointer(tmp_path / "rank1", config(url), is_writer=False)
    assert other_rank.find_resume_payload() is None, "ddp: rank 0 reads it and sends it (agree_on_checkpoint)"
    never = Checkpointer(tmp_path / "new", CheckpointConfig(1, 2, "never", [], url), is_writer=False)
    with pytest.raises(Exception, match=r"checkpoint.resume=never but s3://.* already holds checkpoints"):
        never.refuse_to_overwrite()


@pytest.mark.slow
def test_a_store_that_stops_answering_is_retried_then_one_line_says_it_cannot_be_listed(
    s3_server, tmp_path, caplog
) -> None:
    url = f"{s3_server.bucket()}/run"
    writer = Checkpointer(tmp_path, config(url, retry_s=1.5), is_writer=True)
    writer.save(1, state(1))
    writer.wait()
    s3_server.stop()
    writer.save(2, state(2))
    with caplog.at_level(logging.WARNING), pytest.raises(JobError) as stopped:
        writer.wait()
    message = str(stopped.value)
    # Retried here, after 0.5 s and 1 s, within the 1.5 s: botocore, left to retry a refused connection by
    # itself, would take about 12 s over its first try, and the job would stop long after store_retry_s.
    retries = [record for record in caplog.records if "saving step_00000002.pt failed" in record.getMessage()]
    assert len(retries) >= 2, [record.getMessage() for record in caplog.records]
    assert message.startswith(f"checkpoint.dir={url}: saving step_00000002.pt failed for 2 s"), message
    assert (
        f"the store could not be listed to say which checkpoint it holds (the last one uploaded: "
        f"{url}/step_00000001.pt); the local copies in {tmp_path} stay; fix the store"
    ) in message, message
    assert "\n" not in message
    assert s3_server.secret not in message
    assert (tmp_path / "step_00000001.pt").is_file(), "the local copy of the last one stays too"
    # The owner mark, read before a resume and written at first use, says which of the two failed.
    for what, action in (("reading .owner", lambda: writer.store.read_text(".owner")),
                         ("saving .owner", lambda: writer.store.write_text(".owner", "outputs/a\n"))):  # fmt: skip
        with pytest.raises(JobError) as stopped:
            action()
        assert str(stopped.value).startswith(f"checkpoint.dir={url}: {what} failed for 2 s"), str(stopped.value)


def shards(folder: Path, ranks: int) -> Path:
    """A folder of shards as `ranks` ranks leave it before trainer.pt: each one's file, and the metadata."""
    folder.mkdir()
    for rank in range(ranks):
        (folder / f"__{rank}_0.distcp").write_bytes(bytes([rank]) * 8)
    (folder / ".metadata").write_bytes(b"metadata")
    return folder


def test_rank_zero_waits_for_the_other_ranks_shards_until_every_one_is_there(
    memory_url: str, tmp_path: Path, monkeypatch, caplog
) -> None:
    local = shards(tmp_path / ".tmp_step_00000003", ranks=2)
    store, other_rank = CheckpointStore(memory_url, retry_s=30.0), CheckpointStore(memory_url, retry_s=30.0)
    store.upload(local, "step_00000003", ["__0_0.distcp", ".metadata"])  # rank 0's own part
    waits: list[float] = []

    def rank_one_uploads_meanwhile(seconds: float) -> None:
        assert not waits, "one wait was enough: the shards were there"
        waits.append(seconds)
        other_rank.upload(local, "step_00000003", ["__1_0.distcp"])

    clock = SimpleNamespace(monotonic=time.monotonic, sleep=rank_one_uploads_meanwhile)
    monkeypatch.setattr(f"{CheckpointStore.__module__}.time", clock)  # the wait: rank 1's upload, no sleep
    caplog.set_level(logging.WARNING)
    store.wait_for("step_00000003", ["__1_0.distcp", "__0_0.distcp"])
    assert waits == [0.5], "the first retry's wait"
    assert caplog.messages == [
        "checkpoint store: waiting for step_00000003's shards failed "
        "(FileNotFoundError: 1 shard files not there yet (__1_0.distcp)); retrying in 0.5 s"
    ]
    store.wait_for("step_00000003", ["__0_0.distcp", "__1_0.distcp"])  # all there: no wait (a second fails)
    assert waits == [0.5] and store.last_uploaded is None, "no trainer.pt yet: not whole"


def test_shards_that_never_come_stop_the_job_after_store_retry_s_in_one_line(memory_url: str, tmp_path: Path) -> None:
    store = CheckpointStore(memory_url, retry_s=0.6)
    (tmp_path / "step_00000002.pt").write_bytes(b"whole")
    store.upload(tmp_path / "step_00000002.pt", "step_00000002.pt")
    store.upload(shards(tmp_path / ".tmp_step_00000004", ranks=3), "step_00000004", ["__0_0.distcp", ".metadata"])
    started = time.monotonic()
    with pytest.raises(JobError) as stopped:
        store.wait_for("step_00000004", ["__2_0.distcp", "__0_0.distcp", "__1_0.distcp"])
    waited = time.monotonic() - started
    assert 0.6 <= waited < 5, f"retried for checkpoint.store_retry_s, then stopped ({waited:.2f} s)"
    assert str(stopped.value) == (
        f"checkpoint.dir={memory_url}: waiting for step_00000004's shards failed for 1 s (FileNotFoundError: 2 "
        f"shard files not there yet (__1_0.distcp)); the newest checkpoint there: {memory_url}/step_00000002.pt; "
        "fix the store (address, credentials, space), then launch again to resume from the newest of the store and "
        "the local copies"
    )


def test_a_folder_of_shards_goes_up_and_comes_down_file_by_file_trainer_pt_last_keeping_what_is_there(
    memory_url: str, tmp_path: Path, caplog
) -> None:
    local = shards(tmp_path / ".tmp_step_00000004", ranks=2)
    (local / "trainer.pt").write_bytes(b"trainer")
    (local / "z_extra").write_bytes(b"extra")  # a name after trainer.pt's: trainer.pt still goes up last
    store = CheckpointStore(memory_url, retry_s=1.0)
    put: list[str] = []
    put_file = store.fs.put_file
    store.fs.put_file = lambda source, target: put.append(target.rsplit("/", 1)[-1]) or put_file(source, target)
    try:
        with caplog.at_level(logging.INFO):
            store.upload(local, "step_00000004")
    finally:
        del store.fs.put_file
    assert put[-1] == "trainer.pt" and sorted(put) == [".metadata", "__0_0.distcp", "__1_0.distcp", "trainer.pt",
                                                       "z_extra"], put  # fmt: skip
    assert caplog.messages == [f"checkpoint step_00000004 is in {memory_url}"]
    assert store.last_uploaded == "step_00000004" and store.names() == ["step_00000004"]
    fetched: list[str] = []
    get_file = store.fs.get_file
    store.fs.get_file = lambda remote, target: fetched.append(remote.rsplit("/", 1)[-1]) or get_file(remote, target)
    try:
        assert store.download("step_00000004", tmp_path / "a" / "b").is_dir(), "the folder made, parents too"
        checkpoints = tmp_path / "node" / "checkpoints"
        (checkpoints / "step_00000004").mkdir(parents=True)
        (checkpoints / "step_00000004" / "__0_0.distcp").write_bytes(b"already here")  # a download cut short
        path = store.download("step_00000004", checkpoints)
    finally:
        del store.fs.get_file
    everything = [".metadata", "__0_0.distcp", "__1_0.distcp", "trainer.pt", "z_extra"]
    assert sorted(fetched[:5]) == everything and sorted(fetched[5:]) == everything[:1] + everything[2:], fetched
    assert fetched[4] == fetched[-1] == "trainer.pt", "trainer.pt last: then the folder is whole"
    assert path == checkpoints / "step_00000004"
    expected = {"__0_0.distcp": b"already here", "__1_0.distcp": b"\x01" * 8, ".metadata": b"metadata",
                "trainer.pt": b"trainer", "z_extra": b"extra"}  # fmt: skip
    assert {item.name: item.read_bytes() for item in path.iterdir()} == expected, "what was there is kept"
    elsewhere = tmp_path / "a" / "b" / "step_00000004"
    assert {item.name: item.read_bytes() for item in elsewhere.iterdir()} == {**expected, "__0_0.distcp": bytes(8)}


def failing(store: CheckpointStore, method: str, unrefreshed_only: bool = False) -> None:
    """The store's `method` fails, as a store that stops answering does (only its calls without
    refresh=True when `unrefreshed_only`)."""
    real = getattr(store.fs, method)

    def call(*args, **kwargs):
        if not unrefreshed_only or "refresh" not in kwargs:
            raise OSError("the store went away")
        return real(*args, **kwargs)

    setattr(store.fs, method, call)


@pytest.mark.parametrize(
    ("method", "unrefreshed_only", "action", "what"),
    [
        ("ls", False, lambda store, down: store.names(), "listing the checkpoints"),
        ("ls", False, lambda store, down: store.download("step_00000005", down), "listing step_00000005"),
        ("get_file", False, lambda store, down: store.download("step_00000003.pt", down), "reading step_00000003.pt"),
        ("rm", False, lambda store, down: store.prune(1), "removing step_00000003.pt"),
        (
            "put_file",
            False,
            lambda store, down: store.upload(shards(down, 1), "step_00000006", [".metadata"]),
            "saving step_00000006/.metadata",
        ),
        # a prune's second listing, for uploads a kill cut short (names() lists with refresh=True)
        ("ls", True, lambda store, down: store.prune(2), "listing the checkpoints"),
    ],
)
def test_each_operation_on_a_store_that_stops_answering_is_named_in_its_one_line(
    memory_url: str, tmp_path: Path, method: str, unrefreshed_only: bool, action, what: str
) -> None:
    store = CheckpointStore(f"{memory_url}/", retry_s=0.0)  # a trailing / as a user may write it
    for step in (3, 4):
        (tmp_path / f"step_{step:08d}.pt").write_bytes(b"whole")
        store.upload(tmp_path / f"step_{step:08d}.pt", f"step_{step:08d}.pt")
    store.fs.pipe(f"{store.root}/step_00000005/__0_0.distcp", b"cut")  # an upload under way: not whole
    assert store.names() == ["step_00000004.pt", "step_00000003.pt"]
    store.prune(2)  # the cut folder above the kept ones stays, found by a listing without details
    assert store.fs.exists(f"{store.root}/step_00000005") and len(store.names()) == 2
    failing(store, method, unrefreshed_only)
    try:
        with pytest.raises(JobError) as stopped:
            action(store, tmp_path / "down")
    finally:
        delattr(store.fs, method)
    listed = (f"the newest checkpoint there: {memory_url}/step_00000004.pt" if method != "ls" or unrefreshed_only
              else f"the store could not be listed to say which checkpoint it holds (the last one uploaded: "
              f"{memory_url}/step_00000004.pt)")  # fmt: skip
    assert str(stopped.value) == (
        f"checkpoint.dir={memory_url}: {what} failed for 0 s (OSError: the store went away); {listed}; fix the store "
        "(address, credentials, space), then launch again to resume from the newest of the store and the local copies"
    )


def test_a_store_that_never_answered_names_no_checkpoint(memory_url: str) -> None:
    store = CheckpointStore(memory_url, retry_s=0.0)
    failing(store, "exists")
    try:
        with pytest.raises(JobError, match=r"failed for 0 s \(OSError: the store went away\); the store could not be "
                           r"listed to say which checkpoint it holds; fix the store"):  # fmt: skip
            store.names()
    finally:
        del store.fs.exists


def test_a_store_that_came_back_empty_is_said_to_hold_no_checkpoint_and_the_local_copies_stay(
    memory_url: str, tmp_path: Path
) -> None:
    writer = Checkpointer(tmp_path / "checkpoints", config(memory_url, retry_s=0.0), is_writer=True)
    for step in (4, 8):
        writer.save(step, state(step))
        writer.wait()
    writer.store.fs.rm(writer.store.root, recursive=True)  # the store lost everything (a bucket made anew)
    failing(writer.store, "put_file")
    try:
        writer.save(12, state(12))
        with pytest.raises(JobError) as stopped:
            writer.wait()
    finally:
        del writer.store.fs.put_file
    assert str(stopped.value) == (
        f"checkpoint.dir={memory_url}: saving step_00000012.pt failed for 0 s (OSError: the store went away); the "
        f"store holds no checkpoint; the local copies in {tmp_path / 'checkpoints'} stay; fix the store (address, "
        "credentials, space), then launch again to resume from the newest of the store and the local copies"
    )
    assert "step_00000008.pt" not in str(stopped.value), "uploaded once, gone since: not named as there"
    relaunched = Checkpointer(tmp_path / "checkpoints", config(memory_url), is_writer=True)
    path, payload = relaunched.find_resume_payload()
    assert path == tmp_path / "checkpoints" / "step_00000012.pt" and payload["step"] == 12, "the local newest"


def test_a_failing_store_is_retried_after_waits_that_double(memory_url: str, monkeypatch) -> None:
    store, waits, answers = CheckpointStore(memory_url, retry_s=60.0), [], iter([OSError("busy")] * 3 + ["listed"])

    def action() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(f"{CheckpointStore.__module__}.time", SimpleNamespace(monotonic=time.monotonic,
                                                                              sleep=waits.append))  # fmt: skip
    assert store.retrying("listing the checkpoints", action) == "listed"
    assert waits == [0.5, 1.0, 2.0]


def test_the_best_checkpoints_are_kept_apart_from_keep_last_in_the_store_too(memory_url: str, tmp_path: Path) -> None:
    """checkpoint.keep_best with a store: the writer prunes the store as the local folder, the best kept apart
    (the local folder alone: tests/engine/checkpoint/test_writer.py)."""
    writer = Checkpointer(tmp_path / "checkpoints", config(memory_url, keep_last=1), is_writer=True)
    writer.save(1, state(1))
    writer.keep_best([2, 1])  # as the trainer does: before the save of the new best
    for step in (2, 3, 4):
        assert writer.save(step, state(step))
        writer.wait()
    kept = ["step_00000004.pt", "step_00000002.pt", "step_00000001.pt"]
    assert sorted(path.name for path in (tmp_path / "checkpoints").glob("step_*.pt")) == sorted(kept)
    assert CheckpointStore(memory_url, retry_s=1.0).names() == kept


def test_the_local_checkpoints_and_the_store_are_one_history_the_newest_of_either_resumed(
    memory_url: str, tmp_path: Path, caplog
) -> None:
    local = tmp_path / "run" / "checkpoints"
    alone = Checkpointer(local, config(""), is_writer=True)  # trained without a store: RUN_DIR=X ... max_steps=8
    told: list[int] = []
    alone.on_written.append(told.append)  # what the trackers' sinks are told (engine/assembly/build.py)
    for step in (4, 8):
        alone.save(step, state(step))
        alone.wait()
    assert told == [4, 8], "each checkpoint's step, once it is whole"
    caplog.set_level(logging.INFO)
    assert alone.find_resume_payload()[0] == local / "step_00000008.pt"
    elsewhere = Checkpointer(local, config(memory_url), is_writer=False)  # a rank that reads no store
    assert elsewhere.find_resume_payload()[0] == local / "step_00000008.pt"
    assert not [line for line in caplog.messages if line.startswith("resuming from the")], "no store read: no line"
    relaunched = Checkpointer(local, config(memory_url), is_writer=True)  # checkpoint.dir=s3://... added
    path, payload = relaunched.find_resume_payload()
    assert path == local / "step_00000008.pt" and payload["step"] == 8, "the local newest, not step 0"
    assert caplog.messages[-1] == (
        f"resuming from the local {path}: the newest of the local checkpoints and the store (the store's newest: none)"
    )
    assert not relaunched.save(8, state(8)), "resumed from step 8: never written over"
    relaunched.save(12, state(12))
    relaunched.wait()
    assert CheckpointStore(memory_url, 1.0).names() == ["step_00000012.pt"]
    assert sorted(item.name for item in local.glob("step_*")) == ["step_00000008.pt", "step_00000012.pt"]

    # The store newer than this disk (a node that lost its last checkpoints): the store's comes down.
    behind = tmp_path / "behind" / "checkpoints"
    behind.mkdir(parents=True)
    (behind / "step_00000008.pt").write_bytes((local / "step_00000008.pt").read_bytes())
    path, payload = Checkpointer(behind, config(memory_url), is_writer=True).find_resume_payload()
    assert path == behind / "step_00000012.pt" and payload["step"] == 12
    assert caplog.messages[-1] == (
        f"resuming from the store's {memory_url}/step_00000012.pt, brought down: the newest of the store and the "
        f"local checkpoints (the local newest: {behind / 'step_00000008.pt'})"
    )
    # The same step in both: the local copy, nothing brought down.
    (behind / "step_00000012.pt").unlink()
    (behind / "step_00000012.pt").write_bytes((local / "step_00000012.pt").read_bytes())
    same = Checkpointer(behind, config(memory_url), is_writer=True)
    same.store.fs.get_file = None  # a download would fail
    try:
        path, _ = same.find_resume_payload()
    finally:
        del same.store.fs.get_file
    assert path == behind / "step_00000012.pt"
    assert caplog.messages[-1] == (
        f"resuming from the local {path}: the newest of the local checkpoints and the store (the store's newest: "
        f"{memory_url}/step_00000012.pt)"
    )
    # A new disk: the store's newest comes down, the local newest said to be none.
    path, _ = Checkpointer(tmp_path / "new" / "checkpoints", config(memory_url), is_writer=True).find_resume_payload()
    assert path == tmp_path / "new" / "checkpoints" / "step_00000012.pt"
    assert caplog.messages[-1].endswith("the newest of the store and the local checkpoints (the local newest: none)")


def test_a_checkpoint_dir_with_credentials_in_its_url_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError) as refused:
        CheckpointStore("s3://KEY:SECRET@bucket/run/", retry_s=1.0)
    assert str(refused.value).startswith("checkpoint.dir=s3://***@bucket/run: credentials in the URL are not used: ")


def test_a_checkpoint_dir_that_is_a_url_goes_to_store_pys_store(tmp_path: Path) -> None:
    """files.checkpoint_store: this project's store for a URL, retried for checkpoint.store_retry_s (a folder's
    None, and a project without stores: tests/engine/checkpoint/test_files.py)."""
    store = checkpoint_store(CheckpointConfig(dir="memory://bucket/run", store_retry_s=3.0), tmp_path)
    assert type(store).__module__ == "{{cookiecutter.package_name}}.engine.checkpoint.store" and store.retry_s == 3.0


def test_a_checkpoint_dir_in_a_store_belongs_to_the_run_that_first_used_it(
    memory_url: str, tmp_path: Path, monkeypatch
) -> None:
    def mark(writer: Checkpointer, text: str | None) -> None:  # a store that came back empty: None
        store = writer.store
        store.write_text(".owner", text) if text is not None else store.fs.rm(f"{store.root}/.owner")

    owned_by_the_first_run(memory_url, tmp_path, monkeypatch, config, mark)

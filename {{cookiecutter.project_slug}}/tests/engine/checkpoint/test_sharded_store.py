"""engine/checkpoint/sharded.py with a store (engine/checkpoint/store.py): an fsdp checkpoint goes up whole,
each object once, and a failed one is named; a local folder of shards missing another node's shards is
completed from the store."""

from __future__ import annotations

import logging
import logging.handlers
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import JobError
from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.engine.checkpoint.sharded import ShardedCheckpointer
from {{cookiecutter.package_name}}.engine.checkpoint.store import CheckpointStore

from ...helpers import on_ranks
from .test_sharded import one_step
from .test_store import config as store_config


def save_to_a_store(env: DistEnv, tmp_path: Path) -> dict[str, Any]:
    """An fsdp trainer's checkpoint of step 1 to an object store (fsspec's memory://, this process's),
    saved twice; then step 2's, which the disk refuses (full)."""
    import errno

    from {{cookiecutter.package_name}}.engine.checkpoint import sharded

    trained = one_step(env, tmp_path / "run", "strategy=fsdp", f"checkpoint.dir=memory://{tmp_path.name}/run",
                       "checkpoint.store_retry_s=2")  # fmt: skip
    writer, state = trained.checkpoints.writer, trained.checkpoints.state_dict()
    written: list[int] = []
    writer.on_written.append(written.append)  # what the trackers' sinks are told (engine/assembly/build.py)
    said = logging.getLogger(type(writer).__mro__[1].__module__)  # the writer's log, which the commit uses
    said.setLevel(logging.INFO)
    said.addHandler(lines := logging.handlers.BufferingHandler(100))
    store, sent = writer.store, []
    put_file = store.fs.put_file  # each object of step 1 sent once: the ranks their shards, the writer trainer.pt
    store.fs.put_file = lambda source, target, **kwargs: sent.append(target) or put_file(source, target, **kwargs)
    saved = [writer.save(1, state), writer.save(1, state)]
    writer.wait()
    uploaded = sorted(path.rsplit("/", 1)[-1] for path in store.fs.ls(f"{store.root}/step_00000001", detail=False))

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    sharded.write_atomically = full  # trainer.pt, the last file of a folder, cannot be written
    writer.save(2, state)
    try:
        writer.wait()
    except JobError as error:
        refused = str(error)
    sent = sorted(target.rsplit("/", 1)[-1] for target in sent if "/step_00000001/" in target)
    return {"saved": saved, "last": writer.last_saved_step, "names": store.names(), "uploaded": uploaded, "sent": sent,
            "refused": refused, "written": written, "said": [line.getMessage() for line in lines.buffer]}  # fmt: skip


@pytest.mark.slow
def test_an_fsdp_checkpoint_goes_up_whole_once_and_a_failed_one_is_named(tmp_path: Path) -> None:
    result = on_ranks(1, save_to_a_store, tmp_path)[0]
    assert result["saved"] == [True, False] and result["last"] == 2, "a step is saved once"
    assert result["uploaded"] == [".metadata", "__0_0.distcp", "trainer.pt"], "this rank's shards, then trainer.pt"
    assert result["sent"] == result["uploaded"], "each object sent once"
    assert result["names"] == ["step_00000001"], "whole in the store; step 2, never written, is not there"
    assert result["written"] == [1] and len(result["said"]) == 1, result["said"]
    folder = tmp_path / "run" / "checkpoints"
    assert result["said"][0].startswith(f"saved checkpoint {folder / 'step_00000001'} (written in ")
    assert result["refused"] == (
        f"writing checkpoint {folder / 'step_00000002'} failed (OSError: [Errno 28] No "
        "space left on device); the previous checkpoints are intact: free some space or fix the run dir's "
        "permissions, then launch again"
    )


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process: meant
def test_a_local_folder_of_shards_missing_another_nodes_shards_is_completed_from_the_store(
    memory_url: str, tmp_path: Path, caplog
) -> None:
    import torch.distributed.checkpoint as dcp

    written = tmp_path / "written" / "step_00000005"
    dcp.save({"model": {"w": torch.ones(4)}}, checkpoint_id=written, no_dist=True)
    torch.save({"step": 5, "epoch": 0, "samples_in_epoch": 5}, written / "trainer.pt")
    CheckpointStore(memory_url, 1.0).upload(written, written.name)
    local = tmp_path / "node0" / "checkpoints"
    shutil.copytree(written, local / written.name)
    shards = sorted(item.name for item in written.glob("*.distcp"))
    (local / written.name / shards[0]).unlink()  # without a shared disk: another node's shard is not here
    caplog.set_level(logging.INFO)
    path, payload = ShardedCheckpointer(local, store_config(memory_url), is_writer=True).find_resume_payload()
    assert path == local / written.name and payload["step"] == 5
    assert (path / shards[0]).is_file(), "the missing shard brought down from the store"
    assert caplog.messages[-1].startswith(f"resuming from the store's {memory_url}/step_00000005, brought down")

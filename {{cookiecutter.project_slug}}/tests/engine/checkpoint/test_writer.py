"""engine/checkpoint/writer.py in-process: what is pruned, what is set aside or refused, and that writing
holds no step up."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import CheckpointConfig
from {{cookiecutter.package_name}}.engine.checkpoint import writer as checkpoint
from {{cookiecutter.package_name}}.engine.checkpoint.files import best_checkpoint, load_checkpoint
from {{cookiecutter.package_name}}.engine.checkpoint.writer import Checkpointer

from ...helpers import checkpointer


def save(checkpoints: Checkpointer, step: int) -> None:
    checkpoints.save(step, {"step": step, "model": {"w": torch.full((3,), float(step))}})
    checkpoints.wait()


@pytest.mark.parametrize("keep_last", [1, 3])
def test_unreadable_files_are_set_aside_and_never_push_a_good_checkpoint_out(
    tmp_path: Path, keep_last: int, caplog
) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for step in (901, 902, 903):  # newer than anything this run writes, and not checkpoints
        (folder / f"step_{step:08d}.pt").write_bytes(b"not a checkpoint" * step)
    torch.save({"weights": torch.ones(2)}, folder / "step_00000904.pt")  # loads, but holds no checkpoint
    checkpoints = checkpointer(folder, keep_last)
    for step in (1, 2, 3, 4):
        save(checkpoints, step)
    kept = sorted(path.name for path in folder.glob("step_*.pt"))
    assert kept == [f"step_{step:08d}.pt" for step in range(5 - keep_last, 5)]
    assert sorted(path.name for path in folder.glob("*.unreadable")) == [
        f"step_{step:08d}.pt.unreadable" for step in (901, 902, 903, 904)
    ]
    assert "step_00000904.pt is not a valid checkpoint (no 'model' or 'step'): set aside" in caplog.text


def test_the_best_checkpoints_are_kept_apart_from_keep_last_and_listed_best_first(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    checkpoints = checkpointer(folder, keep_last=2)
    save(checkpoints, 1)
    checkpoints.keep_best([2, 1])  # as the trainer does: before the save of the new best
    for step in (2, 3, 4, 5):
        save(checkpoints, step)
    assert sorted(path.name for path in folder.glob("step_*.pt")) == [f"step_{s:08d}.pt" for s in (1, 2, 4, 5)]
    assert json.loads((folder / "best.json").read_text()) == {"best": ["step_00000002.pt", "step_00000001.pt"],
                                                              "steps": [2, 1]}  # fmt: skip
    assert best_checkpoint(tmp_path / "checkpoints" / "best") == folder / "step_00000002.pt"
    assert best_checkpoint(tmp_path) == folder / "step_00000002.pt", "a run dir finds its checkpoints/"
    checkpoints.keep_best([5])  # 5 displaced both: they go at the next prune
    save(checkpoints, 6)
    assert sorted(path.name for path in folder.glob("step_*.pt")) == [f"step_{s:08d}.pt" for s in (4, 5, 6)], (
        "keep_last=2 counts 6 and the older 4; 5 is kept apart, 1 and 2 are no longer best"
    )
    (folder / "step_00000005.pt").unlink()
    with pytest.raises(ConfigError, match=r"best.json names no checkpoint that is there"):
        best_checkpoint(folder / "best")
    elsewhere = tmp_path / "elsewhere"
    with pytest.raises(ConfigError) as error:
        best_checkpoint(elsewhere / "best")
    assert str(error.value) == (f"{elsewhere / 'best'}: no best.json in {elsewhere} or {elsewhere / 'checkpoints'}: "
                                "the run kept no best checkpoints (train with checkpoint.keep_best=1 or more), or "
                                "give a step_<N>.pt path")  # fmt: skip


def test_bare_best_is_the_newest_run_under_outputs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as error:
        best_checkpoint(Path("best"))
    assert str(error.value) == ("best: no run under outputs/ kept best checkpoints (checkpoint.keep_best): give "
                                "<run dir>/checkpoints/best, or a step_<N>.pt path")  # fmt: skip
    for run, step in (("old", 3), ("new", 7)):
        checkpoints = checkpointer(tmp_path / "outputs" / run / "checkpoints", keep_last=1)
        checkpoints.keep_best([step])
        save(checkpoints, step)
    assert best_checkpoint(Path("best")) == Path("outputs/new/checkpoints/step_00000007.pt")


def test_save_snapshots_the_state_and_writes_it_on_another_thread_without_waiting(tmp_path: Path, monkeypatch) -> None:
    """Writing a checkpoint must not hold training up: save() copies the state on the training
    thread and returns at once; another thread writes the copy while the weights move on."""
    real_write = checkpoint.write_atomically
    release, written = threading.Event(), threading.Event()
    writers: list[threading.Thread] = []

    def held_write(payload, path) -> None:
        writers.append(threading.current_thread())
        release.wait(timeout=5)  # bounded: a write on the training thread fails the test instead of hanging it
        real_write(payload, path)
        written.set()

    monkeypatch.setattr(checkpoint, "write_atomically", held_write)
    checkpoints = checkpointer(tmp_path / "checkpoints", keep_last=3)
    weights = torch.zeros(3)
    assert checkpoints.save(7, {"step": 7, "model": {"w": weights}})
    returned_before_the_write = not written.is_set()
    weights += 1  # the next optimizer step, while the checkpoint is being written
    release.set()
    checkpoints.wait()
    assert returned_before_the_write, "save() waited for the write: every checkpointed step stalls training"
    assert writers and writers[0] is not threading.current_thread(), "written on the training thread"
    saved = load_checkpoint(tmp_path / "checkpoints" / "step_00000007.pt")
    assert torch.equal(saved["model"]["w"], torch.zeros(3)), "the weights as they were at save(), not later"


def test_a_failed_background_write_stops_the_run_and_keeps_the_previous_checkpoints(tmp_path: Path) -> None:
    from {{cookiecutter.package_name}}.common.errors import JobError

    folder = tmp_path / "checkpoints"
    checkpoints = checkpointer(folder, keep_last=5)
    save(checkpoints, 1)
    (folder / "step_00000002.pt").mkdir()  # the name the next write must take is not free: the write fails
    checkpoints.save(2, {"step": 2, "model": {"w": torch.zeros(3)}})
    checkpoints._thread.join()  # the failure is in the background; the training thread notices it at its step
    with pytest.raises(JobError, match=r"writing checkpoint .*step_00000002.pt failed \(IsADirectoryError.*intact"):
        checkpoints.raise_if_failed()
    assert load_checkpoint(folder / "step_00000001.pt")["step"] == 1
    assert not list(folder.glob(".tmp_*")), "no half-written file left"


def test_only_the_writer_writes_and_a_step_is_saved_once(tmp_path: Path) -> None:
    reader = Checkpointer(tmp_path / "r", CheckpointConfig(1, 3, "auto", []), is_writer=False)
    assert not reader.save(1, {"step": 1, "model": {}}) and not (tmp_path / "r").exists(), "a non-writer writes nothing"
    writer = checkpointer(tmp_path / "w", keep_last=3)
    assert writer.save(1, {"step": 1, "model": {}})
    assert not writer.save(1, {"step": 1, "model": {"changed": torch.ones(1)}}), "the same step again: skipped"
    writer.wait()
    assert writer.save(2, {"step": 2, "model": {}})
    writer.wait()
    assert load_checkpoint(tmp_path / "w" / "step_00000001.pt")["model"] == {}


def fake_sharded(folder: Path, step: int) -> Path:
    """A folder that passes for a sharded checkpoint (its metadata file and trainer.pt)."""
    path = folder / f"step_{step:08d}"
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"")
    torch.save({"step": step}, path / "trainer.pt")
    return path


def test_folders_of_shards_are_pruned_and_set_aside_like_files(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        fake_sharded(folder, step)
    checkpoints = checkpointer(folder, keep_last=2)
    checkpoints.prune()
    assert sorted(path.name for path in folder.iterdir()) == ["step_00000002", "step_00000003"]
    checkpoints.set_aside(folder / "step_00000003")
    assert sorted(path.name for path in folder.iterdir()) == ["step_00000002", "step_00000003.unreadable"]
    assert checkpoints.newest_readable()[0] == folder / "step_00000002"
    reader = Checkpointer(folder, CheckpointConfig(1, 2, "auto", []), is_writer=False)
    reader.set_aside(folder / "step_00000002")
    assert (folder / "step_00000002").is_dir(), "only the writer moves files"


def test_resume_never_is_refused_where_checkpoints_exist_and_a_weight_mismatch_is_one_line(tmp_path: Path) -> None:
    from {{cookiecutter.package_name}}.engine.checkpoint.files import restore

    folder = tmp_path / "checkpoints"
    checkpointer(folder, keep_last=1, resume="never").refuse_to_overwrite()  # nothing there yet
    save(checkpointer(folder, keep_last=1), 4)
    with pytest.raises(ConfigError) as never:
        checkpointer(folder, keep_last=1, resume="never").refuse_to_overwrite()
    assert str(never.value) == (
        f"checkpoint.resume=never but {folder} already holds checkpoints (step_00000004.pt); "
        "start a new run dir (leave RUN_DIR out) or use checkpoint.resume=auto to continue it"
    )
    checkpointer(folder, keep_last=1, resume="auto").refuse_to_overwrite()
    payload = {"format_version": 1, "step": 4, "model": torch.nn.Linear(3, 2).state_dict()}
    with pytest.raises(RuntimeError) as torch_said:
        torch.nn.Linear(4, 2).load_state_dict(payload["model"])
    with pytest.raises(ConfigError) as refused:
        restore(torch.nn.Linear(4, 2), payload, Path("step_4.pt"))
    torch_lines = str(torch_said.value).strip().splitlines()[:3]  # its first three lines, on one line
    assert str(refused.value) == f"checkpoint step_4.pt does not fit this model: {' '.join(torch_lines)[:300]}"
    assert str(refused.value).startswith("checkpoint step_4.pt does not fit this model: Error(s) in loading state_dict")
    assert "\n" not in str(refused.value) and "size mismatch" in str(refused.value)


def test_a_write_the_disk_failed_stops_the_job_and_one_a_lost_peer_failed_lets_torchrun_restart(tmp_path) -> None:
    from {{cookiecutter.package_name}}.common.errors import JobError
    from {{cookiecutter.package_name}}.engine.checkpoint.writer import is_storage_error

    full = OSError(28, "No space left on device")
    peer = RuntimeError("[gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:37027: Connection reset by peer")

    class CheckpointException(Exception):  # torch.distributed.checkpoint's: the ranks' failures, with tracebacks
        def __init__(self, failures: dict) -> None:
            super().__init__("failed")
            self.failures = failures

    assert is_storage_error(full) and is_storage_error(CheckpointException({1: (full, None)}))
    assert is_storage_error(CheckpointException({0: peer, 1: full})), "bare exceptions among the failures too"
    assert not is_storage_error(peer) and not is_storage_error(CheckpointException({0: (peer, None)}))
    assert not is_storage_error(ConnectionResetError()), "a socket's OSError is a peer's"
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = full
    assert is_storage_error(wrapped)
    checkpoints = checkpointer(tmp_path / "checkpoints", keep_last=2)
    for error, kind in ((full, JobError), (peer, RuntimeError)):
        checkpoints._error = error
        with pytest.raises(kind) as raised:
            checkpoints.raise_if_failed()
        assert type(raised.value) is kind and "writing checkpoint" in str(raised.value)


def test_a_resume_skips_a_newest_checkpoint_it_cannot_read_and_says_so(tmp_path: Path, caplog) -> None:
    folder = tmp_path / "checkpoints"
    checkpoints = checkpointer(folder, 5)
    for step in (1, 2):
        save(checkpoints, step)
    newest = folder / "step_00000003.pt"
    newest.write_bytes((folder / "step_00000002.pt").read_bytes()[:100])  # cut short (a copy, not our write)
    caplog.set_level("WARNING")
    path, payload = checkpointer(folder, 5).find_resume_payload()
    assert (path, payload["step"]) == (folder / "step_00000002.pt", 2)
    (said,) = [record.getMessage() for record in caplog.records if record.name.endswith(".writer")]
    assert said.startswith(f"skipping unreadable checkpoint {newest} (") and said.endswith("); trying an older one")
    reason = said.removeprefix(f"skipping unreadable checkpoint {newest} (").removesuffix("); trying an older one")
    assert reason and reason != "None", "why it is unreadable"

"""The checkpoint files, in-process: what is pruned, what is refused, what a torn log leaves."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.checkpoint import Checkpointer, NotACheckpoint, load_checkpoint
from {{cookiecutter.package_name}}.config import CheckpointConfig, ConfigError, to_train_config
from {{cookiecutter.package_name}}.logs import MetricsLog

from .conftest import compose_config


def checkpointer(folder: Path, keep_last: int, resume: str = "auto") -> Checkpointer:
    return Checkpointer(folder, CheckpointConfig(every_n_steps=1, keep_last=keep_last, resume=resume), is_writer=True)


def save(checkpoints: Checkpointer, step: int) -> None:
    checkpoints.save(step, {"step": step, "model": {"w": torch.full((3,), float(step))}})
    checkpoints.wait()


@pytest.mark.parametrize("keep_last", [1, 3])
def test_unreadable_files_are_set_aside_and_never_push_a_good_checkpoint_out(tmp_path: Path, keep_last: int) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for step in (901, 902, 903):  # newer than anything this run writes, and not checkpoints
        (folder / f"step_{step:08d}.pt").write_bytes(b"not a checkpoint" * step)
    checkpoints = checkpointer(folder, keep_last)
    for step in (1, 2, 3, 4):
        save(checkpoints, step)
    kept = sorted(path.name for path in folder.glob("step_*.pt"))
    assert kept == [f"step_{step:08d}.pt" for step in range(5 - keep_last, 5)]
    assert sorted(path.name for path in folder.glob("*.unreadable")) == [
        f"step_{step:08d}.pt.unreadable" for step in (901, 902, 903)
    ]


def test_a_non_checkpoint_is_refused_in_one_line_without_the_unsafe_advice(tmp_path: Path) -> None:
    pickled = tmp_path / "object.pt"
    torch.save({"model": {}, "step": 1, "hook": pickle.loads(pickle.dumps(Path("/x")))}, pickled)
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    for path in (pickled, text):
        with pytest.raises(NotACheckpoint) as error:
            load_checkpoint(path)
        message = str(error.value)
        assert "not a checkpoint of this project" in message and "\n" not in message
        assert "weights_only=False" not in message and "weights_only" not in message
    resume = checkpointer(tmp_path / "run" / "checkpoints", 3, resume=str(pickled))
    with pytest.raises(ConfigError, match="checkpoint.resume=.*object.pt holds objects other than tensors"):
        resume.find_resume_payload()


def test_a_torn_last_line_of_metrics_is_dropped_with_a_warning(tmp_path: Path, caplog) -> None:
    path = tmp_path / "metrics.jsonl"
    records = [{"kind": "train", "step": step, "train_loss": 1.0} for step in (10, 20, 30)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"kind": "train", "st')
    metrics = MetricsLog(path, enabled=True)
    metrics.drop_after(20)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [10, 20]
    assert "dropping line 4" in caplog.text


@pytest.mark.parametrize("override", ["+trainer.foo=3", "+seedx=1", "+checkpoint.every_n_step=5"])
def test_a_key_outside_the_schema_is_refused_not_ignored(override: str) -> None:
    key = override.lstrip("+").split("=")[0]
    with pytest.raises(ConfigError, match=f"{key} is not a setting of this project"):
        to_train_config(compose_config([override]))
    to_train_config(compose_config(["+model.dropout_rate=0.1"]))  # the groups are open: a callable's argument


def test_a_checkpoint_of_another_optimizer_is_refused_before_training(tmp_path: Path) -> None:
    from {{cookiecutter.package_name}}.checkpoint import check_same_model
    from {{cookiecutter.package_name}}.config import to_plain_dict

    sgd = to_plain_dict(to_train_config(compose_config(["optim=sgd"])))
    adamw = to_plain_dict(to_train_config(compose_config(["optim=adamw"])))
    check_same_model(tmp_path / "step_1.pt", sgd, sgd)
    with pytest.raises(ConfigError, match="holds the state of optim._target_=torch.optim.SGD, not torch.optim.AdamW"):
        check_same_model(tmp_path / "step_1.pt", sgd, adamw)


def test_a_disk_without_room_for_checkpoints_is_refused_before_training(tmp_path: Path, monkeypatch) -> None:
    import shutil

    from {{cookiecutter.package_name}}.entry import check_room_for_checkpoints

    model = torch.nn.Linear(1000, 1000)  # 4 MB of weights: about 24 MB for checkpoints
    check_room_for_checkpoints(tmp_path / "run", model)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=10 * 2**20))
    with pytest.raises(ConfigError, match=r"has 10 MiB free, and checkpoints of this model need about 23 MiB"):
        check_room_for_checkpoints(tmp_path / "run", model)


def test_a_failed_background_write_stops_the_run_and_keeps_the_previous_checkpoints(tmp_path: Path) -> None:
    from {{cookiecutter.package_name}}.config import JobError

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

"""engine/checkpoint/files.py: what is not a checkpoint of this project is refused in one line, without
the unsafe advice (the writer that prunes and sets files aside: test_writer.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common import storage
from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import CheckpointConfig
from {{cookiecutter.package_name}}.engine.checkpoint.files import (
    NotACheckpoint,
    best_checkpoint,
    checkpoint_store,
    load_checkpoint,
    owner_id,
    remove,
    shards_reader,
    to_cpu,
    write_atomically,
    write_text_atomically,
)

from ...helpers import checkpointer, record_fsyncs


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


def test_remove_takes_a_file_or_a_folder_and_one_already_gone(tmp_path: Path) -> None:
    """Pruning and setting aside race nothing: a checkpoint another writer removed first is no error."""
    file, folder = tmp_path / "step_00000004.pt", tmp_path / "step_00000008"
    file.write_bytes(b"x")
    (folder / "inner").mkdir(parents=True)
    (folder / "inner" / "shard.distcp").write_bytes(b"x")
    for path in (file, folder, file, folder):  # the second time each is gone already
        remove(path)
        assert not path.exists()


def test_a_file_is_on_the_disk_before_its_name_and_its_name_before_the_next_step(tmp_path: Path, monkeypatch) -> None:
    """fsync of the temporary file before the rename (else a power loss could leave the new name on an empty
    file), then of the folder (else the rename itself could be lost); best.json's file too."""
    import os

    monkeypatch.setattr(os, "fsync", os.fsync)  # given back after the test
    synced = record_fsyncs()
    write_atomically({"step": 1}, tmp_path / "step_00000001.pt")
    assert synced == [str(tmp_path / f".tmp_step_00000001.pt.{os.getpid()}"), str(tmp_path)]
    synced.clear()
    write_text_atomically("[]", tmp_path / "best.json")
    assert synced == [str(tmp_path / f".tmp_best.json.{os.getpid()}")]


def test_to_cpu_copies_every_tensor_of_nested_lists_tuples_and_dicts(tmp_path: Path) -> None:
    live = torch.ones(3)
    state = {"groups": [{"params": [0, 1]}], "pair": (live, 2), "steps": [live]}
    copied = to_cpu(state)
    live.add_(1)  # training goes on while the copy is written: the copy keeps the step's values
    assert copied["groups"] == [{"params": [0, 1]}] and isinstance(copied["pair"], tuple)
    assert torch.equal(copied["pair"][0], torch.ones(3)) and torch.equal(copied["steps"][0], torch.ones(3))


def test_a_run_dir_is_named_relative_to_the_working_dir_below_it_else_absolute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert owner_id(tmp_path / "outputs" / "run") == os.path.join("outputs", "run")
    assert owner_id(Path("/elsewhere/run")) == "/elsewhere/run"


def test_a_bare_best_is_the_newest_runs_best_checkpoint(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for number, run in enumerate(("older", "newer", "oldest")):
        folder = tmp_path / "outputs" / run / "checkpoints"
        folder.mkdir(parents=True)
        (folder / "step_00000004.pt").write_bytes(b"")
        (folder / "best.json").write_text(json.dumps({"best": ["step_00000004.pt"]}))
        os.utime(folder / "best.json", (1000 + number, [1000, 3000, 500][number]))
    assert best_checkpoint(Path("best")) == Path("outputs/newer/checkpoints/step_00000004.pt")


def test_a_folder_of_shards_is_read_by_sharded_py_or_refused_in_one_line_where_the_project_has_none(
    tmp_path: Path, monkeypatch
) -> None:
    module = "{{cookiecutter.package_name}}.engine.checkpoint.sharded"
    if importlib.util.find_spec(module) is not None:  # a project made with the strategies that write them
        assert shards_reader(tmp_path).__name__ == module
    found = importlib.util.find_spec  # a project made without them: no sharded.py beside files.py
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name.endswith(".sharded") else found(name))
    with pytest.raises(ConfigError) as refused:
        shards_reader(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path} is a folder of shards, and this project was made without the strategies that read them: export "
        "its weights to one file with the project that wrote it (python -m {{cookiecutter.package_name}}.export "
        f"{tmp_path} weights.pt) and give that file as model.init_from"
    )


def test_a_store_is_store_pys_or_refused_in_one_line_where_the_project_has_none(tmp_path: Path, monkeypatch) -> None:
    assert checkpoint_store(CheckpointConfig(dir=str(tmp_path)), tmp_path) is None, "a folder: no store"
    monkeypatch.setattr(storage, "stores", lambda: None)  # a project made without stores
    with pytest.raises(ConfigError) as refused:
        checkpoint_store(CheckpointConfig(dir="https://user:secret@host/run"), tmp_path)
    assert str(refused.value) == ("checkpoint.dir=https://user:***@host/run: a URL, and this project keeps its files "
                                  "on this machine's disks: give a folder")  # fmt: skip

"""common/storage.py: a URL is no path on this machine's disk; a command that reads a checkpoint there
refuses one in one line saying what to give, as does a setting that names a URL where the project keeps its
files on its own disks only."""

from __future__ import annotations

import pytest

from {{cookiecutter.package_name}}.common import storage
from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.common.storage import is_remote, local_path, store_module


def test_urls_are_remote_and_paths_are_not() -> None:
    assert is_remote("https://host/prefix") and is_remote("ftp://host/p")
    assert not any(map(is_remote, ["", "outputs/run/checkpoints", "/abs/path", "file:///tmp/x"]))


def test_a_checkpoint_url_is_refused_in_one_line_saying_to_copy_it_down(monkeypatch) -> None:
    given = "outputs/run/checkpoints/step_00000004.pt"
    assert local_path(given, "ckpt_path") == given
    with pytest.raises(ConfigError) as refused:
        local_path("https://user:secret@host/run/step_00000004.pt", "ckpt_path")
    message = str(refused.value)
    assert message.startswith("ckpt_path=https://user:***@host/run/step_00000004.pt: a checkpoint is read from this "
                              "machine's disk, not from a URL: copy it down first")  # fmt: skip
    assert message.endswith(" and give the local path") and "\n" not in message
    monkeypatch.setattr(storage, "stores", lambda: None)  # a project made without stores: the line says no more
    with pytest.raises(ConfigError) as refused:
        local_path("https://host/run/step_00000004.pt", "model.init_from")
    assert str(refused.value) == (
        "model.init_from=https://host/run/step_00000004.pt: a checkpoint is read from this machine's disk, not from a "
        "URL: copy it down first and give the local path"
    )


def test_a_url_where_the_project_has_no_store_is_refused_in_one_line_saying_to_give_a_folder(monkeypatch) -> None:
    monkeypatch.setattr(storage, "stores", lambda: None)  # a project made without stores
    with pytest.raises(ConfigError) as refused:
        store_module("https://user:secret@host/run", "checkpoint.dir")
    assert str(refused.value) == ("checkpoint.dir=https://user:***@host/run: a URL, and this project keeps its files "
                                  "on this machine's disks: give a folder")  # fmt: skip

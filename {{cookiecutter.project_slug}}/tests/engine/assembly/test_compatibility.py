"""engine/assembly/compatibility.py: nodes launched with other settings stop together; data prepared again is
refused at a resume (the rules of what a resume may change: tests/config/test_compatibility.py)."""

from __future__ import annotations

import os

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError, JobError
from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.config import to_plain_dict, to_train_config
from {{cookiecutter.package_name}}.engine.assembly.compatibility import (
    SamePreparedData,
    check_same_config_everywhere,
)

from ...helpers import compose_config, on_ranks


def plain(*overrides: str) -> dict:
    return to_plain_dict(to_train_config(compose_config(["data=synthetic", "model=small_cnn", *overrides])))


def launched_with(env: DistEnv, overrides_by_rank: list[list[str]]) -> tuple[str, int] | None:
    """One rank as a node of its own, with its node's overrides: what the check says, if anything."""
    os.environ["GROUP_RANK"] = str(env.rank)
    try:
        check_same_config_everywhere(plain(*overrides_by_rank[env.rank]), env)
    except JobError as error:
        return str(error), error.exit_code
    return None


def test_nodes_launched_with_other_settings_stop_together_naming_the_keys_and_nodes() -> None:
    assert on_ranks(2, launched_with, [["optim.lr=0.1"], ["optim.lr=0.1"]]) == [None, None]
    said = on_ranks(2, launched_with, [[], ["optim.lr=0.01", "data.train_size=512"]])
    assert said[0] == said[1], "every rank stops at once, with the same line"
    message, exit_code = said[0]
    assert exit_code == 2 and "\n" not in message
    assert message == (
        "the nodes were launched with different settings (node 1: data.train_size=512 where node 0 has 4096; "
        "optim.lr=0.01 where node 0 has 0.1): launch every node with the same overrides"
    )


def test_nodes_that_differ_in_what_a_resume_accepts_or_where_it_resumes_from_are_named_too() -> None:
    """What a resume may change (checkpoint.allow_changes, checkpoint.resume) does matter between nodes: one
    node would accept a checkpoint the other refuses, or start afresh while the other resumes."""
    said = on_ranks(2, launched_with, [[], ["checkpoint.allow_changes=[data]", "checkpoint.resume=never"]])
    assert said[0] == said[1], "every rank stops at once, with the same line"
    assert said[0] == (
        "the nodes were launched with different settings (node 1: checkpoint.allow_changes=['data'] where node 0 "
        "has []; checkpoint.resume='never' where node 0 has 'auto'): launch every node with the same overrides",
        2,
    )


def test_prepared_data_prepared_again_under_the_same_root_is_refused_unless_accepted() -> None:
    saved = SamePreparedData({"root": "data/prepared", "id": "a" * 32}, []).state_dict()
    assert saved == {"prepared_data": "a" * 32}, "the id only, not the root (a URL may hold a key)"
    SamePreparedData({"root": "data/moved", "id": "a" * 32}, []).load_state_dict(saved)  # the same data, moved
    with pytest.raises(ConfigError) as refused:
        SamePreparedData({"root": "data/prepared", "id": "b" * 32}, []).load_state_dict(saved)
    message = str(refused.value)
    assert message.startswith("data.root=data/prepared was prepared again since the checkpoint was written (its id "
                              "bbbbbbbbbbbb, the checkpoint's aaaaaaaaaaaa)") and "\n" not in message  # fmt: skip
    assert message.endswith("or accept it: checkpoint.allow_changes=[data.root]")
    for allowed in (["data.root"], ["data"]):
        SamePreparedData({"root": "data/prepared", "id": "b" * 32}, allowed).load_state_dict(saved)
    SamePreparedData({"root": "data/prepared", "id": "b" * 32}, []).load_state_dict({})  # a checkpoint of before
    SamePreparedData(None, []).load_state_dict(saved)  # an in-memory data set now: data.* keys tell the change
    assert SamePreparedData(None, []).state_dict() == {}

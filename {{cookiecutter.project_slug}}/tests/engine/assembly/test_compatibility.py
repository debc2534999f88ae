"""compatibility.py: what a resume may change (listed) and what it refuses (one line, how to go on)."""

from __future__ import annotations

import os

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError, JobError
from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.config import to_plain_dict, to_train_config
from {{cookiecutter.package_name}}.engine.assembly.compatibility import (
    SamePreparedData,
    check_resumable,
    check_same_config_everywhere,
)

from ...helpers import compose_config, on_ranks

MIDWAY = {"epoch": 1, "step": 20, "samples_in_epoch": 512}  # where a checkpoint of a 2-epoch run stands
FINISHED = {"epoch": 2, "step": 32, "samples_in_epoch": 0}


def plain(*overrides: str) -> dict:
    return to_plain_dict(to_train_config(compose_config(["data=synthetic", "model=small_cnn", *overrides])))


def resume(saved: dict, now: dict, at: dict = MIDWAY, epochs: int = 2) -> list[str]:
    return check_resumable("step_20.pt", {**at, "config": saved}, now, epochs)


def test_safe_changes_are_allowed_and_listed() -> None:
    changes = resume(plain(), plain("optim.lr=0.01", "trainer.epochs=6", "data.batch_size=16", "strategy=fsdp"))
    assert changes == ["data.batch_size: 64 -> 16", "optim.lr: 0.1 -> 0.01", "strategy: 'ddp' -> 'fsdp'",
                       "trainer.epochs: 4 -> 6"]  # fmt: skip
    assert resume(plain(), plain()) == []
    shards = ["data=shards", "task=classification"]  # a store's shards cached elsewhere on a new machine
    moved = resume(plain(*shards), plain(*shards, "data.cache_dir=/scratch/cache", "data.cache_limit_gb=2"))
    assert moved == ["data.cache_dir: '' -> '/scratch/cache'", "data.cache_limit_gb: 10 -> 2"]


def test_a_global_batch_set_or_changed_on_resume_is_allowed_and_listed_as_a_batch_size_change_is() -> None:
    """A resume counts the epoch's samples done, not its steps: batched otherwise, none is repeated or skipped."""
    changes = resume(plain("data.global_batch_size=24"), plain("data.global_batch_size=48", "data.micro_batch_size=8"))
    assert changes == ["data.global_batch_size: 24 -> 48", "data.micro_batch_size: None -> 8"]
    assert resume(plain(), plain("data.global_batch_size=48")) == ["data.global_batch_size: None -> 48"]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("seed=1", "seed: checkpoint 0, config 1"),  # the synthetic set's own seed argument follows it: one key
        ("data.train_size=1024", "data.train_size: checkpoint 4096, config 1024"),
        ("data.augment=true", "data.augment: checkpoint False, config True"),
    ],
)
def test_a_change_to_what_an_epoch_holds_or_its_order_is_refused_naming_the_key(override: str, named: str) -> None:
    key = override.split("=")[0]
    with pytest.raises(ConfigError) as refused:
        resume(plain(), plain(override))
    message = str(refused.value)
    assert f"another sample order or data set ({named}): resuming would repeat or skip samples" in message, message
    assert "\n" not in message and message.endswith(f"accept it: checkpoint.allow_changes=[{key}]"), message
    assert resume(plain(), plain(override, f"checkpoint.allow_changes=[{key}]")) == [
        f"{key}: {named.split('checkpoint ')[1].split(',')[0]} -> {named.split('config ')[1]}"
    ]
    assert len(resume(plain(), plain(override, "checkpoint.allow_changes=[data,seed]"))) == 1, "a prefix accepts"


def test_another_data_set_is_refused_with_its_section_to_accept() -> None:
    with pytest.raises(ConfigError, match=r"data.augment: checkpoint False, config True; .* more\): .*\[data\]$"):
        resume(plain(), plain("data=image_folder"))


def test_another_model_or_optimizer_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"does not fit this model \(model.width: checkpoint 32, config 16\)"):
        resume(plain(), plain("model.width=16"))
    with pytest.raises(ConfigError, match="holds the state of optim._target_=torch.optim.SGD, not torch.optim.AdamW"):
        resume(plain(), plain("optim=adamw"))
    allowed = resume(plain(), plain("model.width=16", "checkpoint.allow_changes=[model.width]"))
    assert allowed == ["model.width: 32 -> 16"]


def test_a_finished_run_relaunched_with_changes_that_would_train_nothing_is_refused() -> None:
    done = plain("trainer.epochs=2")
    with pytest.raises(ConfigError, match=r"has finished \(epoch 2 of 2, step 32\) and would train nothing .*optim.lr"):
        resume(done, plain("trainer.epochs=2", "optim.lr=0.01"), at=FINISHED)
    assert resume(done, plain("trainer.epochs=2"), at=FINISHED) == []  # it says it has finished, exit 0
    changed_logging = resume(done, plain("trainer.epochs=2", "log.all_ranks_console=true"), at=FINISHED)
    assert changed_logging == ["log.all_ranks_console: False -> True"]
    more_epochs = resume(done, plain("trainer.epochs=3", "optim.lr=0.01"), at=FINISHED, epochs=3)
    assert more_epochs == ["optim.lr: 0.1 -> 0.01", "trainer.epochs: 2 -> 3"]


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


def test_a_run_by_steps_or_stopped_early_is_finished_and_says_how_it_would_go_on() -> None:
    by_steps = plain("trainer.max_steps=30")
    at_end = {"epoch": 1, "step": 30, "samples_in_epoch": 64}
    with pytest.raises(ConfigError, match=r"has finished \(step 30 of 30\) .*or more trainer.max_steps to go on"):
        resume(by_steps, plain("trainer.max_steps=30", "optim.lr=0.01"), at=at_end)
    assert resume(by_steps, plain("trainer.max_steps=40", "optim.lr=0.01"), at=at_end)  # more steps: it trains
    stopped = {**MIDWAY, "monitor": {"stopped": "val_loss has not improved for 3 validations"}}
    with pytest.raises(ConfigError, match=r"\(stopped early: val_loss has not improved .*or a new run dir to go on"):
        resume(plain(), plain("trainer.epochs=9"), at=stopped)


def test_model_init_from_is_read_by_a_new_run_only_and_new_settings_at_their_default_change_nothing() -> None:
    assert resume(plain(), plain("model.init_from=other/w.pt")) == ["model.init_from: None -> 'other/w.pt'"]
    assert resume(plain("model.init_from=a.pt"), plain(), at=FINISHED) == ["model.init_from: 'a.pt' -> None"]
    older = plain()  # a checkpoint written before trainer.max_steps and the EMA existed
    for key in ("max_steps", "val_every_n_steps", "ema"):
        del older["trainer"][key]
    assert resume(older, plain()) == []


def test_prepared_data_prepared_again_under_the_same_root_is_refused_unless_accepted() -> None:
    saved = SamePreparedData({"root": "data/tokens", "id": "a" * 32}, []).state_dict()
    assert saved == {"prepared_data": "a" * 32}, "the id only: a store's root may hold a key"
    SamePreparedData({"root": "data/moved", "id": "a" * 32}, []).load_state_dict(saved)  # the same data, moved
    with pytest.raises(ConfigError) as refused:
        SamePreparedData({"root": "data/tokens", "id": "b" * 32}, []).load_state_dict(saved)
    message = str(refused.value)
    assert message.startswith("data.root=data/tokens was prepared again since the checkpoint was written (its id "
                              "bbbbbbbbbbbb, the checkpoint's aaaaaaaaaaaa)") and "\n" not in message  # fmt: skip
    assert message.endswith("or accept it: checkpoint.allow_changes=[data.root]")
    for allowed in (["data.root"], ["data"]):
        SamePreparedData({"root": "data/tokens", "id": "b" * 32}, allowed).load_state_dict(saved)
    SamePreparedData({"root": "data/tokens", "id": "b" * 32}, []).load_state_dict({})  # a checkpoint of before
    SamePreparedData(None, []).load_state_dict(saved)  # data=text now: data.* keys tell the change
    assert SamePreparedData(None, []).state_dict() == {}

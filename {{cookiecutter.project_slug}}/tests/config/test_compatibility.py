"""config/compatibility.py: what a resume may change (listed) and what it refuses (one line, how to go on),
and when a run has finished."""

from __future__ import annotations

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import to_plain_dict, to_train_config
from {{cookiecutter.package_name}}.config.compatibility import check_resumable, run_finished
from {{cookiecutter.package_name}}.engine.state import TrainState  # the trainer's state, as the loop asks

from ..helpers import WIDEST, compose_config

MIDWAY = {"epoch": 1, "step": 20, "samples_in_epoch": 512}  # where a checkpoint of a 2-epoch run stands
FINISHED = {"epoch": 2, "step": 32, "samples_in_epoch": 0}


def plain(*overrides: str) -> dict:
    return to_plain_dict(to_train_config(compose_config(["data=synthetic", "model=small_cnn", *overrides])))


def resume(saved: dict, now: dict, at: dict = MIDWAY, epochs: int = 2) -> list[str]:
    return check_resumable("step_20.pt", {**at, "config": saved}, now, epochs)


def test_safe_changes_are_allowed_and_listed() -> None:
    changes = resume(plain(), plain("optim.lr=0.01", "trainer.epochs=6", "data.batch_size=16", f"strategy={WIDEST}"))
    switched = [f"strategy: 'ddp' -> '{WIDEST}'"] if WIDEST != "ddp" else []  # where the project has another
    assert changes == ["data.batch_size: 64 -> 16", "optim.lr: 0.1 -> 0.01", *switched, "trainer.epochs: 4 -> 6"]
    assert resume(plain(), plain()) == []


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


def test_a_run_finishes_after_its_epochs_at_max_steps_or_when_stopped_early() -> None:
    state = TrainState(epoch=2, step=10, samples_in_epoch=0)
    assert run_finished(state.state_dict(), epochs=2, max_steps=0)
    assert not run_finished(state.state_dict(), epochs=3, max_steps=0)
    assert not run_finished({**state.state_dict(), "samples_in_epoch": 8}, epochs=2, max_steps=0), "mid-epoch"
    assert run_finished(state.state_dict(), epochs=9, max_steps=10), "max_steps decides where set"
    assert not run_finished(state.state_dict(), epochs=1, max_steps=11)
    stopped = {**state.state_dict(), "monitor": {"stopped": "val_loss did not improve"}}
    assert run_finished(stopped, epochs=9, max_steps=0)

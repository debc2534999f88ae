"""config/compose.py: Hydra's composed config into checked dataclasses and back to plain values: the
project's defaults, a key outside the schema refused, no password in what is written of it."""

from __future__ import annotations

import json

import pytest
from hydra.errors import HydraException

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import to_plain_dict, to_train_config

from ..helpers import PROJECT_DIR, compose_config


def test_defaults_are_the_choices_the_project_was_made_with() -> None:
    answers = json.loads((PROJECT_DIR / ".cookiecutter.json").read_text())["cookiecutter"]
    config = to_train_config(compose_config(classification=False))
    task = "classification" if answers["default_task"] == "image_classification" else answers["default_task"]
    chosen_task = to_train_config(compose_config([f"task={task}"], classification=False))
    assert (config.task, config.model, config.data) == (chosen_task.task, chosen_task.model, chosen_task.data)
    if task == "classification":
        groups = [f"model={answers['default_model']}", f"data={answers['default_data']}", "optim=sgd"]
        chosen = to_train_config(compose_config(groups))
        assert (config.model, config.data, config.optim) == (chosen.model, chosen.data, chosen.optim)
        assert config.task["_target_"].endswith("tasks.Classification")
    assert config.dist.backend == "auto" and config.checkpoint.resume == "auto"


def test_unknown_model_lists_the_choices() -> None:
    with pytest.raises(HydraException, match="resnet18"):
        compose_config(["model=vgg11"])


@pytest.mark.parametrize("override", ["+trainer.foo=3", "+seedx=1", "+checkpoint.every_n_step=5"])
def test_a_key_outside_the_schema_is_refused_not_ignored(override: str) -> None:
    key = override.lstrip("+").split("=")[0]
    with pytest.raises(ConfigError, match=f"{key} is not a setting of this project"):
        to_train_config(compose_config([override]))
    to_train_config(compose_config(["+model.dropout_rate=0.1"]))  # the groups are open: a callable's argument


def test_the_config_a_checkpoint_and_the_trackers_get_holds_no_password() -> None:
    config = to_train_config(compose_config(["data=cifar10", "data.root=https://key:hush@host/cifar"]))
    assert to_plain_dict(config)["data"]["root"] == "https://key:***@host/cifar"
    assert config.data.node["root"] == "https://key:hush@host/cifar", "the job itself uses the real value"


def test_an_evaluations_data_override_reaches_the_checkpoints_data_set_or_is_refused() -> None:
    """A checkpoint holds its data node resolved: data.val_size=5 must reach the data set's val_size."""
    from hydra import initialize_config_dir

    from {{cookiecutter.package_name}}.config import compose_for_checkpoint, config_dir

    saved = to_plain_dict(to_train_config(compose_config(["data=synthetic", "data.val_size=16"])))
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        evaluated = compose_for_checkpoint(saved, ["ckpt_path=x.pt", "data.val_size=5", "data.batch_size=4"])
        assert evaluated.data.val_size == 5 and evaluated.data.dataset.val_size == 5
        assert evaluated.data.batch_size == 4 and evaluated.data.dataset.train_size == saved["data"]["train_size"]
        saved["data"]["dataset"]["val_size"] = 8  # the run set the data set's own key, not data.val_size
        with pytest.raises(ConfigError, match=r"^data.val_size: the checkpoint's data set does not take data.val_size"):
            compose_for_checkpoint(saved, ["ckpt_path=x.pt", "data.val_size=5"])


def test_an_evaluation_reaches_the_checkpoints_groups_whatever_the_default_groups_hold() -> None:
    """The default data group (cifar10 in some bakes) may lack data.val_size: an evaluation's
    data.val_size=5 still reaches the checkpoint's synthetic set, and a key its group lacks is refused."""
    from hydra import initialize_config_dir

    from {{cookiecutter.package_name}}.config import compose_for_checkpoint, config_dir, let_group_keys_through

    argv = ["eval.py", "ckpt_path=x.pt", "data.val_size=5", "model=small_cnn", "model.width=4", "seed=3", "+a.b=1"]
    let_group_keys_through(argv)
    assert argv[2:] == ["++data.val_size=5", "model=small_cnn", "model.width=4", "seed=3", "+a.b=1"]
    saved = to_plain_dict(
        to_train_config(compose_config(["data=synthetic", "data.val_size=16", "task=classification"]))
    )
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        evaluated = compose_for_checkpoint(saved, ["ckpt_path=x.pt", "data=cifar10"])
        assert evaluated.data.root, "a whole group given is the default's group, not the checkpoint's"
        evaluated = compose_for_checkpoint(saved, ["ckpt_path=x.pt", "++data.val_size=5", "++data.image_size=8"])
        assert evaluated.data.dataset.val_size == 5 and evaluated.data.dataset.image_size == 8
        with pytest.raises(ConfigError, match=r"^data.no_such_key: the checkpoint's data has no such key"):
            compose_for_checkpoint(saved, ["ckpt_path=x.pt", "++data.no_such_key=5"])

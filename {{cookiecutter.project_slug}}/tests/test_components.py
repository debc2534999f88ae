"""components.py: `_target_`s that cannot work are refused before any process starts."""

from __future__ import annotations

import pytest

from {{cookiecutter.package_name}}.components import check_components
from {{cookiecutter.package_name}}.config import ConfigError, to_train_config

from .helpers import compose_config


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model._target_=nowhere.Model", "model._target_=nowhere.Model does not import (ModuleNotFoundError"),
        ("model._target_=torch.nn.Nope", "model._target_=torch.nn.Nope does not import (AttributeError"),
        ("model._target_=builtins.dict", "model._target_=builtins.dict returned a dict, not a torch.nn.Module"),
        ("data.dataset._target_=builtins.list", "data.dataset._target_=builtins.list failed: TypeError"),
        ("data.dataset._target_=builtins.dict", "data.dataset._target_=builtins.dict returned a dict, not a pair"),
        ("optim._target_=torch.optim.Nope", "optim._target_=torch.optim.Nope does not import"),
        ("task._target_={{cookiecutter.package_name}}.tasks.LanguageModel", "model, data and task do not fit together"),
    ],
)
def test_a_target_that_cannot_work_is_refused_naming_the_key(override: str, message: str) -> None:
    config = to_train_config(compose_config(["data=synthetic", "model=small_cnn", override]))
    with pytest.raises(ConfigError) as error:
        check_components(config)
    assert message in str(error.value) and "\n" not in str(error.value)

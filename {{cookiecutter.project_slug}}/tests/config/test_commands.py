"""config/commands.py: predict.yaml's keys over the train config, `split` one of the data set's sets."""

from __future__ import annotations

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import PredictConfig, to_train_config

from ..helpers import compose_config


def test_predict_yaml_composes_to_its_schema_with_its_defaults() -> None:
    config = to_train_config(compose_config(["ckpt_path=c.pt", "out=p.pt"], name="predict"))
    assert isinstance(config, PredictConfig)
    assert (config.out, config.split, config.predict_as) == ("p.pt", "val", None)


def test_a_split_the_data_set_has_not_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as error:
        to_train_config(compose_config(["ckpt_path=c.pt", "out=p.pt", "split=test"], name="predict"))
    assert str(error.value) == "split='test' is not one of val, train"

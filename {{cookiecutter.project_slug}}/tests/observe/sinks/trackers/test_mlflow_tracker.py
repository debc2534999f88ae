"""mlflow_tracker.py in-process: a server that does not answer is one line before the launch (the
tracker itself, against a real MLflow server: e2e/test_mlflow.py)."""

from __future__ import annotations

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.observe.sinks.trackers.mlflow_tracker import check as check_server

from ....helpers import check_launch_for, compose_config, free_port


def test_a_server_that_does_not_answer_is_refused_in_one_line_without_its_password(monkeypatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    port = free_port()  # nothing listens there
    uri = f"http://ada:pw123@127.0.0.1:{port}"
    config = to_train_config(compose_config(["log.mlflow=true", f"log.mlflow_tracking_uri={uri}"])).log
    with pytest.raises(ConfigError) as refused:
        check_server(config)
    assert str(refused.value) == (
        f"log.mlflow=true but the MLflow server at http://ada:***@127.0.0.1:{port} does not answer (Connection "
        "refused): start it, fix log.mlflow_tracking_uri (or $MLFLOW_TRACKING_URI), or set log.mlflow=false"
    )
    with pytest.raises(ConfigError, match="does not answer"):  # what the launch checks
        check_launch_for(["log.mlflow=true", f"log.mlflow_tracking_uri={uri}"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the environment's URI is checked alike
    with pytest.raises(ConfigError, match="does not answer"):
        check_server(to_train_config(compose_config(["log.mlflow=true"])).log)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    check_server(to_train_config(compose_config(["log.mlflow=true"])).log)  # the run dir's SQLite: nothing to reach

"""MLflow (log.mlflow=true): the run's scalars as MLflow metrics by step, its resolved config as params.

The tracking URI is log.mlflow_tracking_uri, else $MLFLOW_TRACKING_URI, else a SQLite store in
the run dir (`mlflow ui --backend-store-uri sqlite:///<run dir>/mlflow.db`). What is sent, and
when, is the trackers package's business (__init__.py); this module only speaks MLflow, on the trackers' thread.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ....common.errors import ConfigError
from ....common.redaction import redact_text
from ....config import LogConfig
from .records import Held, Record

CONNECT_TIMEOUT_S = 5.0
MAX_METRICS_PER_CALL = 1000  # MLflow's limits on one log_batch call
MAX_PARAMS_PER_CALL = 100
MAX_PARAM_LENGTH = 500  # the longest param value every MLflow server takes (newer ones take more)


def tracking_uri(config: LogConfig, run_dir: Path) -> str:
    """Where the run goes: the config's URI, else the environment's, else a store in the run dir."""
    local = f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
    return config.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or local


def check(config: LogConfig) -> None:
    """An MLflow server to log to must answer now; a local store (SQLite, a folder) is made as needed."""
    uri = config.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or ""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return
    try:
        socket.create_connection((parts.hostname, parts.port or {"http": 80, "https": 443}[parts.scheme]),
                                 timeout=CONNECT_TIMEOUT_S).close()  # fmt: skip
    except OSError as error:
        raise ConfigError(
            f"log.mlflow=true but the MLflow server at {redact_text(uri)} does not answer ({error.strerror or error}): "
            "start it, fix log.mlflow_tracking_uri (or $MLFLOW_TRACKING_URI), or set log.mlflow=false"
        ) from None


def flat_params(node: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The config as MLflow params: dotted keys (model._target_), values as text."""
    params = {}
    for key, value in node.items():
        if isinstance(value, dict):
            params.update(flat_params(value, f"{prefix}{key}."))
        else:
            params[f"{prefix}{key}"] = str(value)[:MAX_PARAM_LENGTH]
    return params


class MlflowTracker:
    """One MLflow run, created or continued, fed records in step order."""

    name = "mlflow"

    def __init__(self, config: LogConfig, run_dir: Path) -> None:
        from mlflow import MlflowClient

        mlflow_logs = logging.getLogger("mlflow")  # MLflow prints to a handler of its own: through this rank's
        mlflow_logs.handlers.clear()  # instead (its prefix, its log file, no credentials)
        mlflow_logs.propagate = True

        self.client = MlflowClient(tracking_uri(config, run_dir))
        self.experiment = config.mlflow_experiment
        self.run_dir = run_dir
        self.run_id = ""

    def resume(self, run_id: str) -> Held | None:
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException as error:
            if error.error_code == "RESOURCE_DOES_NOT_EXIST":  # another store, or a run deleted for good
                return None
            raise
        if run.info.lifecycle_stage == "deleted":
            return None
        # MLflow keeps every point: the last step of each metric is the newest of its history.
        history = {name: self.client.get_metric_history(run_id, name) for name in run.data.metrics}
        self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        return Held({name: max(point.step for point in points) for name, points in history.items()})

    def create(self, plain_config: dict[str, Any]) -> str:
        from mlflow.entities import Param

        experiment = self.client.get_experiment_by_name(self.experiment)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(self.experiment)
        tags = {"run_dir": str(self.run_dir.resolve())}
        self.run_id = self.client.create_run(experiment_id, run_name=self.run_dir.name, tags=tags).info.run_id
        params = [Param(key, value) for key, value in flat_params(plain_config).items()]
        for start in range(0, len(params), MAX_PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=params[start : start + MAX_PARAMS_PER_CALL])
        return self.run_id

    def send(self, records: list[Record]) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        batch: list[Metric] = []
        for record in records:  # whole records per call: a kill between calls leaves each metric a prefix
            if len(batch) + len(record.scalars) > MAX_METRICS_PER_CALL:
                self.client.log_batch(self.run_id, metrics=batch)
                batch = []
            batch += [Metric(name, value, now_ms, record.step) for name, value in record.scalars.items()]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def finish(self, outcome: str) -> None:
        self.client.set_terminated(self.run_id, status=outcome)


NAME = "mlflow"
TRACKER = MlflowTracker

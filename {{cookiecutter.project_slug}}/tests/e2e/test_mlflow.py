"""MLflow through real jobs whose rank 0 (the trackers' process) is SIGKILLed and restarted by torchrun:
one MLflow run, every logged step in it once, read back from a real tracking server (SQLite) on
127.0.0.1; and no password reaches anything written. The project's other trackers ride on the same job
(tracker_jobs.riders), and their runs are checked as their own tests check one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..helpers import PYTHON, free_port
from .tracker_jobs import LAST_STEP, points_of_metrics_jsonl, records, riders, run_and_kill

pytestmark = pytest.mark.slow


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory) -> Iterator[str]:
    """`mlflow server` with a SQLite store, on 127.0.0.1 and a port the OS says is free."""
    folder = tmp_path_factory.mktemp("mlflow_server")
    url = f"http://127.0.0.1:{free_port()}"
    command = [
        PYTHON, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
        "--default-artifact-root", str(folder / "artifacts"), "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1],
        "--workers", "1",
    ]  # fmt: skip
    # The server's job runner starts a dozen consumer processes the tracking API does not need.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(folder / "server.log", "wb") as server_log:
        server = subprocess.Popen(command, env=env, stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not answers(url):
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the MLflow server did not start:\n{(folder / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # its session: the server and its workers
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def test_mlflow_run_survives_a_sigkill_with_every_step_once_and_no_password(
    mlflow_server: str, tmp_path: Path, monkeypatch
) -> None:
    from mlflow import MlflowClient

    password = "pw-4a7c19e"  # the server asks for none; the client sends it: it must be written nowhere
    uri = mlflow_server.replace("http://", f"http://tester:{password}@")
    run_dir = tmp_path / "run"
    beside = riders("mlflow")  # one job for every tracker: each holds every step once
    for rider in beside:
        rider.prepare(monkeypatch, tmp_path)
    output = run_and_kill(run_dir, "log.mlflow=true", f"log.mlflow_tracking_uri={uri}",
                          f"log.mlflow_experiment={tmp_path.name}",
                          *(override for rider in beside for override in rider.OVERRIDES))  # fmt: skip
    assert password not in output, "nor on the console"
    written = [path for path in run_dir.rglob("*") if path.is_file() and password.encode() in path.read_bytes()]
    assert written == [], "the checkpoints, config.yaml, .hydra/, the logs, the other trackers' files: redacted"
    for rider in beside:
        rider.check(run_dir, output)
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name(tmp_path.name)
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, "the restart continued the run"
    mlflow_run = runs[0]
    kept = json.loads((run_dir / "trackers.json").read_text())
    assert kept["mlflow"] == mlflow_run.info.run_id and len(kept) == 1 + len(beside)
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.params["trainer.epochs"] == "4" and mlflow_run.data.params["model._target_"]
    assert mlflow_run.data.params["log.mlflow_tracking_uri"] == uri.replace(password, "***")
    assert not any(password in value for value in mlflow_run.data.params.values())
    expected = points_of_metrics_jsonl(run_dir)
    histories = {name: client.get_metric_history(mlflow_run.info.run_id, name) for name in mlflow_run.data.metrics}
    got = [(name, point.step) for name, history in histories.items() for point in history]
    assert Counter(got) == Counter(expected) and len(set(got)) == len(got), "every logged step once"
    final = [record for record in records(run_dir) if record["kind"] == "val"][-1]
    assert final["step"] == LAST_STEP
    for name in ("loss", "acc"):
        (point,) = [point for point in histories[f"val/{name}"] if point.step == final["step"]]
        assert point.value == final[f"val_{name}"], "the final validation figures, exactly"

"""Experiment-tracker runs through real jobs whose rank 0 (the trackers' process) is SIGKILLed and
restarted by torchrun: one tracker run, every logged step in it once, read back with the tracker's
own tools.{% if cookiecutter.mlflow == "yes" %} MLflow: a real tracking server (SQLite) on 127.0.0.1.{% endif %}
{%- if cookiecutter.wandb == "yes" %} W&B: offline, with no API key
and nothing of the user's, so nothing leaves the machine.{% endif %}
"""

from __future__ import annotations

import json
import os
import signal
{%- if cookiecutter.mlflow == "yes" %}
import subprocess
import time
import urllib.request
{%- endif %}
from collections import Counter
{%- if cookiecutter.mlflow == "yes" %}
from collections.abc import Iterator
{%- endif %}
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.logs import metric_name

from ..helpers import (
    PYTHON,
    SMALL,
    finish,
{%- if cookiecutter.mlflow == "yes" %}
    free_port,
{%- endif %}
{%- if cookiecutter.wandb == "yes" %}
    run,
{%- endif %}
    start,
    steps_saved,
    wait_for,
    worker_pid,
)

pytestmark = pytest.mark.slow

# 4 epochs of 16 steps on 2 processes, a record every 2 steps, a checkpoint every 10 and at each
# epoch's end: after the checkpoints of steps 20, 32, 40 and 50, three records come before the next one.
JOB = [
    *SMALL,
    "trainer.epochs=4",
    "trainer.log_every_n_steps=2",
    "checkpoint.every_n_steps=10",
    "checkpoint.keep_last=20",
]
LAST_STEP = 64


def records(run_dir: Path) -> list[dict]:
    """metrics.jsonl's records so far (a line being written is skipped)."""
    path = run_dir / "metrics.jsonl"
    found = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return found


def kill_rank_zero_past_a_checkpoint(run_dir: Path) -> None:
    """SIGKILL rank 0 once it has logged three steps past a checkpoint written while its tracker runs
    were open: a tracker sent those records would get them twice, as the restart redoes the steps."""
    wait_for(lambda: (run_dir / "trackers.json").is_file(), "the tracker runs to open")
    opened_after = max(steps_saved(run_dir), default=0)

    def ready() -> bool:
        newest = max(steps_saved(run_dir), default=0)
        past = [record for record in records(run_dir) if record["step"] > newest]
        return newest > opened_after and len(past) >= 3

    wait_for(ready, "three steps logged past a checkpoint")
    os.kill(worker_pid(run_dir, 0), signal.SIGKILL)


def points_of_metrics_jsonl(run_dir: Path) -> list[tuple[str, int]]:
    """(metric, step) for every scalar metrics.jsonl holds, by the trackers' names."""
    kinds_and_steps = [(record["kind"], record["step"]) for record in records(run_dir)]
    assert len(kinds_and_steps) == len(set(kinds_and_steps)), "metrics.jsonl itself holds every step once"
    names = [(metric_name(key), record["step"]) for record in records(run_dir) for key in record]
    return [(name, step) for name, step in names if name is not None]


def run_and_kill(run_dir: Path, *overrides: str) -> str:
    """The job, killed once, to its end; the tracker run id it kept."""
    proc = start(run_dir, 2, *JOB, *overrides)
    kill_rank_zero_past_a_checkpoint(run_dir)
    code, output = finish(proc)
    assert code == 0, output[-3000:]
    assert (run_dir / "logs" / "rank_0.log").read_text().count("run dir:") == 2, "torchrun restarted the workers once"
    return output
{%- if cookiecutter.mlflow == "yes" %}


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


def test_mlflow_run_survives_a_sigkill_with_every_step_once_and_no_password(mlflow_server: str, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    password = "pw-4a7c19e"  # the server asks for none; the client sends it: it must be written nowhere
    uri = mlflow_server.replace("http://", f"http://tester:{password}@")
    run_dir = tmp_path / "run"
    output = run_and_kill(run_dir, "log.mlflow=true", f"log.mlflow_tracking_uri={uri}",
                          f"log.mlflow_experiment={tmp_path.name}")  # fmt: skip
    assert password not in output, "nor on the console"
    written = [path for path in run_dir.rglob("*") if path.is_file() and password.encode() in path.read_bytes()]
    assert written == [], "the checkpoints, config.yaml, .hydra/, the logs: redacted everywhere"
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name(tmp_path.name)
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, "the restart continued the run"
    mlflow_run = runs[0]
    assert json.loads((run_dir / "trackers.json").read_text()) == {"mlflow": mlflow_run.info.run_id}
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
{%- endif %}
{%- if cookiecutter.wandb == "yes" %}


def wandb_rows(run_file: Path) -> list[dict]:
    """The history rows of a W&B transaction log, as W&B's own inspector prints them."""
    printed = run([PYTHON, "-m", "wandb", "leet", "inspect", "--json", str(run_file)], expect_ok=False)
    rows = [json.loads(line) for line in printed.stdout.splitlines() if line.startswith("{")]
    return [row["history"]["item"] for row in rows if row.get("type") == "history"]


def test_wandb_offline_run_keeps_its_id_across_a_restart_with_every_step_once(tmp_path: Path, monkeypatch) -> None:
    inspector = run([PYTHON, "-m", "wandb", "leet", "inspect", "--help"], expect_ok=False)
    assert inspector.returncode == 0, "this wandb has no `wandb leet inspect`: pip install -e '.[dev]' (wandb>=0.31)"
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "wandb_home"  # W&B's settings, caches and netrc: none of the user's
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(home / name.lower()))
    monkeypatch.setenv("NETRC", str(home / "netrc"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    output = run_and_kill(run_dir, "log.wandb=true")  # log.wandb_mode=online, but there is no API key
    assert "wandb: no API key" in output
    run_id = json.loads((run_dir / "trackers.json").read_text())["wandb"]
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert [path.name for path in files] == [f"run-{run_id}.wandb"] * 2, "one run id, reused by the restart"
    rows = [row for path in files for row in wandb_rows(path)]
    got = [(name, row["_step"]) for row in rows for name in row if not name.startswith("_")]
    assert Counter(got) == Counter(points_of_metrics_jsonl(run_dir)), "every logged step once"
    final = [record for record in records(run_dir) if record["kind"] == "val"][-1]
    (last_row,) = [row for row in rows if row["_step"] == final["step"]]
    assert (last_row["val/loss"], last_row["val/acc"]) == (final["val_loss"], final["val_acc"])
{%- endif %}

"""wandb_tracker.py in-process: the mode, W&B's key lookup and the offline-file reader, on files W&B
itself wrote (the tracker through real jobs: e2e/test_wandb.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import LogConfig, to_train_config
from {{cookiecutter.package_name}}.observe.sinks.trackers import Record

from ....helpers import check_launch_for, compose_config


def log_config(*overrides: str) -> LogConfig:
    return to_train_config(compose_config(["log.wandb=true", *overrides])).log


def test_wandb_mode_is_online_or_offline() -> None:
    with pytest.raises(ConfigError, match="log.wandb_mode='disabled' is not one of online, offline"):
        check_launch_for(["log.wandb=true", "log.wandb_mode=disabled"])


@pytest.fixture
def wandb_home(tmp_path: Path, monkeypatch) -> Path:
    """W&B with no key and nothing of the user's: its settings, caches and netrc in tmp_path."""
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "wandb_home"
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(home / name.lower()))
    monkeypatch.setenv("NETRC", str(home / "netrc"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    return home


def test_the_api_key_is_found_in_the_environment_or_wandb_logins_netrc(wandb_home: Path, monkeypatch) -> None:
    from {{cookiecutter.package_name}}.observe.sinks.trackers.wandb_tracker import api_key_set

    assert not api_key_set()
    wandb_home.mkdir()
    (wandb_home / "netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert api_key_set()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")  # a key for another server does not count
    assert not api_key_set()
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert api_key_set()


@pytest.mark.slow
def test_the_offline_reader_finds_the_last_step_that_wandb_wrote(wandb_home: Path, tmp_path: Path) -> None:
    import wandb

    from {{cookiecutter.package_name}}.observe.sinks.trackers.wandb_tracker import offline_last_step

    settings = wandb.Settings(console="off")
    run = wandb.init(project="p", id="reader1", mode="offline", dir=str(tmp_path), settings=settings)
    for step in (3, 5, 9):
        run.log({"train/loss": 1.0 / step}, step=step, commit=True)
    run.finish()
    wandb.teardown()  # what WandbTracker.finish does: the file is whole once it returns
    folder = tmp_path / "wandb"
    assert offline_last_step(folder, "reader1") == 9
    assert offline_last_step(folder, "other") is None
    (path,) = folder.glob("offline-run-*/run-reader1.wandb")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # a process killed mid-write leaves the file short: never an error
    assert offline_last_step(folder, "reader1") in (-1, 3, 5, 9)


def test_a_wandb_row_waits_for_a_later_step_so_a_validation_after_a_restart_still_joins_it(
    wandb_home: Path, tmp_path: Path, monkeypatch
) -> None:
    # SIGTERM in an epoch's last step checkpoints that step before its validation runs; the restart
    # validates it. A W&B row takes no values once written: step 16's must not be written before.
    # The command line holds a password (in a URI): W&B writes its args down, redacted.
    password = "pw-83d1f0"
    monkeypatch.setattr("sys.argv", ["train.py", f"+data.source=https://me:{password}@host/images"])
    from wandb.proto import wandb_internal_pb2

    from {{cookiecutter.package_name}}.observe.sinks.trackers.wandb_tracker import WandbTracker, transaction_log

    config = log_config("log.wandb_mode=offline")
    first = WandbTracker(config, tmp_path)
    run_id = first.create({"seed": 0})
    first.send([Record(8, {"train/loss": 0.5}), Record(16, {"train/loss": 0.4})])
    first.finish("KILLED")
    second = WandbTracker(config, tmp_path)
    held = second.resume(run_id)
    assert held is not None and held.newest() == 8
    second.send(held.missing([Record(8, {"train/loss": 0.5}), Record(16, {"train/loss": 0.4})]))  # the catch-up
    second.send([Record(16, {"val/loss": 0.3}), Record(20, {"train/loss": 0.2})])
    second.finish("FINISHED")
    rows = []
    for path in sorted((tmp_path / "wandb").glob(f"offline-run-*/run-{run_id}.wandb")):
        for data in transaction_log(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            if record.WhichOneof("record_type") == "history":
                names = sorted("/".join(item.nested_key) or item.key for item in record.history.item)
                names = [name for name in names if not name.startswith("_")]
                rows.append((record.history.step.num, names))
    assert rows == [(8, ["train/loss"]), (16, ["train/loss", "val/loss"]), (20, ["train/loss"])]
    files = [path for path in (tmp_path / "wandb").rglob("*") if path.is_file()]
    written = [path for path in files if password.encode() in path.read_bytes()]
    assert written == [] and sys.argv[1].endswith(f":{password}@host/images"), "redacted for W&B alone"

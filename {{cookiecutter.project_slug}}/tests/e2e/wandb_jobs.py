"""W&B's side of the tracker jobs (tracker_jobs.py): offline, with no API key and nothing of the user's, so
nothing leaves the machine; its run read back with W&B's own inspector."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from ..helpers import PYTHON, run
from .tracker_jobs import points_of_metrics_jsonl, records


def wandb_offline(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """W&B offline, with no API key and nothing of the user's (settings, caches, netrc): nothing leaves
    the machine. Checks first that this wandb has the inspector the test reads the run back with."""
    inspector = run([PYTHON, "-m", "wandb", "leet", "inspect", "--help"], expect_ok=False)
    assert inspector.returncode == 0, "this wandb has no `wandb leet inspect`: pip install -e '.[dev]' (wandb>=0.31)"
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(home / name.lower()))
    monkeypatch.setenv("NETRC", str(home / "netrc"))
    monkeypatch.setenv("WANDB_MODE", "offline")


def wandb_rows(run_file: Path) -> list[dict]:
    """The history rows of a W&B transaction log, as W&B's own inspector prints them."""
    printed = run([PYTHON, "-m", "wandb", "leet", "inspect", "--json", str(run_file)], expect_ok=False)
    rows = [json.loads(line) for line in printed.stdout.splitlines() if line.startswith("{")]
    return [row["history"]["item"] for row in rows if row.get("type") == "history"]


def assert_one_wandb_run_with_every_step_once(run_dir: Path, output: str) -> None:
    """After run_and_kill with log.wandb=true (log.wandb_mode=online, but there is no API key)."""
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


# Its part of a job another tracker's test hosts (tracker_jobs.riders).
OVERRIDES = ["log.wandb=true"]


def prepare(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    wandb_offline(monkeypatch, tmp_path / "wandb_home")


def check(run_dir: Path, output: str) -> None:
    assert_one_wandb_run_with_every_step_once(run_dir, output)

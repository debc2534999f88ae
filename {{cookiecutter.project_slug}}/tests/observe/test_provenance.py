"""provenance.py: each start of a run adds a record (commit, dirtiness and diff, versions, hardware,
command, training variables) to the run dir's provenance.json, with no secret in it; checkpoints and
exports carry it; the trackers get it as params and eval says its commit."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.common.launch_command import LAUNCH_COMMAND_ENV
from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly import build
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.engine.checkpoint.files import load_checkpoint
from {{cookiecutter.package_name}}.export import export
from {{cookiecutter.package_name}}.observe.provenance import (
    DIFFS_DIR,
    PROVENANCE_FILE,
    Provenance,
    describe,
    read_records,
    summary,
    write_export_record,
)

from ..helpers import compose_config, cpu_env

SECRETS = ("secret123", "db-secret-456", "hunter2", "tok789", "pw777", "pw888")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def dirty_repo(tmp_path: Path, monkeypatch) -> Path:
    """A repository with one commit and a tracked file changed since."""
    if shutil.which("git") is None:
        pytest.skip("no git on this machine")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "model.py").write_text("width = 4\n")
    git(repo, "add", "model.py")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    (repo / "model.py").write_text("width = 8\n")
    return repo


@pytest.fixture
def secret_environment(monkeypatch) -> None:
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("HF_TOKEN", "secret123")
    monkeypatch.setenv("DATABASE_PASSWORD", "db-secret-456")
    monkeypatch.setenv("NCCL_PROXY_URL", "http://me:hunter2@proxy:3128")  # allowed name, a password inside
    monkeypatch.setenv("TORCH_HUB_TOKEN", "tok789")  # allowed prefix, a secret's name
    monkeypatch.setattr(sys, "argv", ["train.py", "trainer.epochs=2", "+log.service_password=pw777"])
    monkeypatch.setenv(LAUNCH_COMMAND_ENV, json.dumps(["single", "NPROC_PER_NODE=2", "data.url=https://k:pw888@b"]))


def test_a_dirty_tree_records_its_commit_dirtiness_and_diff_and_no_secret(
    tmp_path: Path, dirty_repo: Path, secret_environment: None
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    Provenance.start(run_dir, cpu_env(0, 2), source=dirty_repo)
    text = (run_dir / PROVENANCE_FILE).read_text()
    (record,) = json.loads(text)
    assert record["git"] == {"commit": git(dirty_repo, "rev-parse", "HEAD"), "dirty": True,
                             "diff": f"{DIFFS_DIR}/diff_1.patch"}  # fmt: skip
    diff = (run_dir / record["git"]["diff"]).read_text()
    assert "-width = 4" in diff and "+width = 8" in diff
    assert record["versions"]["python"] and record["versions"]["torch"] and record["versions"]["project"]
    assert record["hardware"]["world_size"] == 2 and record["hardware"]["nodes"] == 1
    assert record["environment"]["NCCL_SOCKET_IFNAME"] == "eth0" and record["environment"]["OMP_NUM_THREADS"] == "3"
    assert record["environment"]["NCCL_PROXY_URL"] == "http://me:***@proxy:3128"
    assert record["environment"]["TORCH_HUB_TOKEN"] == "***"
    assert "HF_TOKEN" not in text and "DATABASE_PASSWORD" not in text  # never other variables
    assert record["command"]["argv"] == ["train.py", "trainer.epochs=2", "+log.service_password=***"]
    assert record["command"]["launcher"] == ["single", "NPROC_PER_NODE=2", "data.url=https://k:***@b"]
    for secret in SECRETS:
        assert secret not in text, secret
    assert summary(record) == f"trained at commit {record['git']['commit']} with uncommitted changes"


def test_each_start_appends_a_record_and_a_clean_tree_has_no_diff(tmp_path: Path, dirty_repo: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    Provenance.start(run_dir, cpu_env(0, 1), source=dirty_repo)
    first = read_records(run_dir)
    git(dirty_repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-am", "second")
    Provenance.start(run_dir, cpu_env(0, 1), source=dirty_repo)  # the relaunch (or torchrun's restart)
    records = read_records(run_dir)
    assert records[:1] == first and [record["start"] for record in records] == [1, 2]
    assert records[1]["git"] == {"commit": git(dirty_repo, "rev-parse", "HEAD"), "dirty": False, "diff": None}
    assert sorted(path.name for path in (run_dir / DIFFS_DIR).iterdir()) == ["diff_1.patch"]
    assert not list(run_dir.glob(".*.tmp")), "written atomically: no temporary file left"


def test_outside_a_repository_the_commit_is_null_and_other_ranks_write_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    (tmp_path / "code").mkdir()
    Provenance.start(tmp_path, cpu_env(1, 2), source=tmp_path / "code")
    assert not (tmp_path / PROVENANCE_FILE).exists(), "rank 0 alone writes it"
    provenance = Provenance.start(tmp_path, cpu_env(0, 2), source=tmp_path / "code")
    assert read_records(tmp_path) == [provenance.record] and provenance.record["git"] is None
    assert not (tmp_path / DIFFS_DIR).exists()
    assert provenance.params()["provenance.git"] is None and provenance.params()["provenance.start"] == 1
    assert summary(provenance.record) == "trained outside a git repository (no commit recorded)"


TINY = ["model=small_cnn", "model.width=4", "data=synthetic", "data.train_size=48", "data.val_size=16",
        "data.batch_size=16", "data.image_size=8", "trainer.epochs=1", "data.num_classes=10"]  # fmt: skip


def test_a_run_records_each_start_its_checkpoints_carry_it_and_the_export_writes_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = build_trainer(to_train_config(compose_config(TINY)), cpu_env(0, 1), run_dir)
    try:
        first.fit()
    finally:
        first.metrics.close()
    (checkpoint,) = (run_dir / "checkpoints").glob("step_*.pt")
    payload = load_checkpoint(checkpoint)
    assert payload["provenance"] == read_records(run_dir)[0]
    resumed = build_trainer(to_train_config(compose_config([*TINY, "trainer.epochs=2"])), cpu_env(0, 1), run_dir)
    resumed.metrics.close()
    assert [record["start"] for record in read_records(run_dir)] == [1, 2], "a resume appends a second record"
    assert resumed.checkpoints.state_dict()["provenance"]["start"] == 2, "its checkpoints carry the resumed start's"

    export(checkpoint, tmp_path / "model.pt")
    exported = json.loads((tmp_path / f"model.pt.{PROVENANCE_FILE}").read_text())
    assert exported["run"] == payload["provenance"] and exported["step"] == payload["step"]


def test_a_checkpoint_from_before_records_takes_its_run_dirs_or_none(tmp_path: Path) -> None:
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000003.pt"
    checkpoint.parent.mkdir(parents=True)
    write_export_record(checkpoint, {"step": 3}, tmp_path / "a.pt", "weights")
    assert json.loads((tmp_path / f"a.pt.{PROVENANCE_FILE}").read_text())["run"] is None
    (tmp_path / "run" / PROVENANCE_FILE).write_text(json.dumps([{"start": 1}, {"start": 2}]))
    (tmp_path / "folder").mkdir()  # an OUT that is a folder holds its record
    write_export_record(checkpoint, {"step": 3}, tmp_path / "folder", "weights")
    assert json.loads((tmp_path / "folder" / PROVENANCE_FILE).read_text())["run"] == {"start": 2}
    assert summary(None).startswith("the checkpoint carries no provenance record")
    assert describe({"step": 3, "provenance": {"git": None}}) == "trained outside a git repository (no commit recorded)"


class Sink:
    """A sink that keeps the params it is started with."""

    def __init__(self) -> None:
        self.params: dict = {}

    def start(self, resumed_step: int, metrics_path: Path, params: dict, own_checkpoint: bool) -> None:
        self.params = params

    def write(self, kind: str, values: dict) -> None:
        pass

    def close(self) -> None:
        pass


def test_the_sinks_get_the_record_as_params_beside_the_config(tmp_path: Path, monkeypatch) -> None:
    sink = Sink()
    monkeypatch.setattr(build, "build_sinks", lambda *args: [sink])
    build_trainer(to_train_config(compose_config(TINY)), cpu_env(0, 1), tmp_path).metrics.close()
    (record,) = read_records(tmp_path)
    assert sink.params["provenance.versions.torch"] == record["versions"]["torch"]
    assert sink.params["provenance.hardware.world_size"] == 1 and sink.params["trainer"]["epochs"] == 1

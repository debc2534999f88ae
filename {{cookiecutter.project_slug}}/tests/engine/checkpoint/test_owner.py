"""engine/checkpoint/owner.py: a checkpoint.dir belongs to the run that first used it; another run is refused,
the same run relaunched anywhere is let through, a lost mark written again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError, JobError
from {{cookiecutter.package_name}}.config import CheckpointConfig
from {{cookiecutter.package_name}}.engine.checkpoint.files import local_folder
from {{cookiecutter.package_name}}.engine.checkpoint.writer import Checkpointer

from ...helpers import check_launch_for, trainer


def config(folder: str, keep_last: int = 2) -> CheckpointConfig:
    return CheckpointConfig(every_n_steps=1, keep_last=keep_last, resume="auto", allow_changes=[], dir=folder)


def state(step: int) -> dict:
    return {"model": {"w": torch.full((3,), float(step))}, "optimizer": {}, "step": step, "epoch": 0,
            "samples_in_epoch": step}  # fmt: skip


def refused_both(other: Checkpointer, its_run: Path, refusal: str, before_work: str) -> None:
    """`other` (another run's writer) is refused with `refusal` as it claims the folder, and by the launch
    checks, before any work (no run dir yet), with a line matching `before_work`."""
    with pytest.raises(ConfigError) as refused:
        other.claim(its_run)
    assert str(refused.value) == refusal
    with pytest.raises(ConfigError, match=before_work):
        other.check_owner(None)


def owned_by_the_first_run(url: str, tmp_path: Path, monkeypatch, config: Callable[[str], CheckpointConfig],
                           mark: Callable[[Checkpointer, str | None], None]) -> None:  # fmt: skip
    """checkpoint.dir=`url` belongs to the run that first used it, wherever it is (a folder here; any other
    place a checkpoint.dir may name, where the project has one, by its own tests). `config(url)`: the
    checkpoint section that names it; `mark(writer, text)`: its .owner written as `text`, or lost (None)."""
    monkeypatch.chdir(tmp_path)  # run dirs below the working dir are named relative to it: the same on any machine
    run_a, run_b = tmp_path / "outputs" / "a", tmp_path / "outputs" / "b"
    a = Checkpointer(local_folder(run_a, config(url)), config(url), is_writer=True)
    a.claim(run_a)
    a.save(6, state(6))
    a.wait()
    b = Checkpointer(local_folder(run_b, config(url)), config(url), is_writer=True)
    refusal = (f"checkpoint.dir={url} belongs to the run in outputs/a (its .owner says so), not to this one in "
               f"outputs/b: give this run a checkpoint.dir of its own, or launch with RUN_DIR=outputs/a to continue "
               "that run")  # fmt: skip
    refused_both(b, run_b, refusal, r"not to this one in a new run dir: ")
    # The same run relaunched (a restart, a Slurm requeue, the job on another machine with RUN_DIR=outputs/a).
    again = Checkpointer(local_folder(tmp_path / "elsewhere", config(url)), config(url), is_writer=True)
    again.claim(Path("outputs/a"))
    assert again.find_resume_payload()[1]["step"] == 6
    # The mark lost (removed, or never kept where it was written): written again at the next save, which goes on.
    mark(a, None)
    a.save(7, state(7))
    a.wait()
    assert a.read_owner() == "outputs/a"
    # Two runs launched at the same moment, both finding no owner: the one whose mark is not there stops.
    mark(a, "outputs/b\n")
    a.save(9, state(9))
    with pytest.raises(JobError) as stopped:
        a.wait()
    assert str(stopped.value) == (
        f"checkpoint.dir={url} now belongs to the run in outputs/b (its .owner), not to this one in outputs/a: two "
        "runs were given the same checkpoint.dir; give each its own, then launch again"
    )
    assert not (local_folder(run_a, config(url)) / "step_00000009.pt").exists()
    own = Checkpointer(run_b / "checkpoints", config(""), is_writer=True)  # the run dir's own checkpoints/
    own.claim(run_b)
    assert not (run_b / "checkpoints" / ".owner").exists() and own.owner is None


def test_a_checkpoint_dir_belongs_to_the_run_that_first_used_it(tmp_path: Path, monkeypatch) -> None:
    def mark(writer: Checkpointer, text: str | None) -> None:
        owner = Path(writer.config.dir) / ".owner"
        owner.write_text(text) if text is not None else owner.unlink()

    owned_by_the_first_run(str(tmp_path / "disk" / "shared"), tmp_path, monkeypatch, config, mark)  # parents made too


def test_a_run_dirs_own_checkpoints_are_that_runs_without_an_owner_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    run_a, run_b = Path("outputs/a"), Path("outputs/b")
    a = Checkpointer(run_a / "checkpoints", config(""), is_writer=True)  # checkpoint.dir left out: no .owner
    a.claim(run_a)
    for step in (5, 6):
        a.save(step, state(step))
        a.wait()
    (run_a / ".hydra").mkdir()  # what the run left in its run dir as it started
    (run_a / "checkpoints" / ".tmp_step_00000007.pt.1").write_bytes(b"a's write under way")
    url = str(tmp_path / "outputs" / "a" / "checkpoints")
    b = Checkpointer(Path(url), config(url, keep_last=1), is_writer=True)
    refusal = (f"checkpoint.dir={url} is the checkpoints/ of the run in outputs/a, not of this one in outputs/b: "
               "another run may start from its checkpoints (model.init_from, checkpoint.resume=<its step_<N>.pt>) "
               "but never write there; leave checkpoint.dir out, or launch with RUN_DIR=outputs/a to continue that "
               "run")  # fmt: skip
    refused_both(b, run_b, refusal, r"not of this one in a new run dir: ")
    assert sorted(path.name for path in (run_a / "checkpoints").iterdir()) == [
        ".tmp_step_00000007.pt.1", "step_00000005.pt", "step_00000006.pt"]  # fmt: skip
    again = Checkpointer(Path(url), config(url), is_writer=True)  # the same run, its checkpoint.dir spelt out
    again.claim(run_a)
    assert again.find_resume_payload()[1]["step"] == 6
    # A folder named checkpoints that is no run dir's: the first run to use it owns it, as any checkpoint.dir.
    shared = tmp_path / "disk" / "checkpoints"
    Checkpointer(shared, config(str(shared)), is_writer=True).claim(run_b)
    assert (shared / ".owner").read_text() == "outputs/b\n"


def test_a_run_is_refused_another_runs_checkpoints_before_it_writes_anything(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a" / ".hydra").mkdir(parents=True)
    trainer(tmp_path / "a")
    config_a = (tmp_path / "a" / "checkpoints" / "config.yaml").read_text()
    refused = r"^checkpoint.dir=\S+ is the checkpoints/ of the run in a, not of this one in b"
    with pytest.raises(ConfigError, match=refused):
        trainer(tmp_path / "b", f"checkpoint.dir={tmp_path / 'a' / 'checkpoints'}", "trainer.epochs=3")
    assert (tmp_path / "a" / "checkpoints" / "config.yaml").read_text() == config_a
    with pytest.raises(ConfigError, match=r"is the checkpoints/ of the run in a, not of this one in b"):
        check_launch_for(["data=synthetic", f"checkpoint.dir={tmp_path / 'a' / 'checkpoints'}"], tmp_path / "b")

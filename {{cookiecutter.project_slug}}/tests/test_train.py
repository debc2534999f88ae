"""train.py in the package: the entry that `python -m`, torchrun and the console script run, in this process."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from {{cookiecutter.package_name}} import train as entry
from {{cookiecutter.package_name}}.common.run_dir import FINISHED_MARKER

# @record wants a real stderr for faulthandler; under capsys it has none, which changes nothing here.
pytestmark = pytest.mark.filterwarnings("ignore:Unable to enable fault handler:UserWarning")

TINY = ["model=small_cnn", "model.width=4", "data=synthetic", "data.train_size=48", "data.val_size=16",
        "data.batch_size=16", "data.image_size=8", "trainer.epochs=1", "task=classification"]  # fmt: skip


@pytest.mark.parametrize("legacy", [["--local-rank=0"], ["--local_rank", "0"]])
def test_a_job_trains_with_the_argument_torch_distributed_launch_appends(
    in_process, monkeypatch, tmp_path: Path, legacy: list[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["train.py", *TINY, f"hydra.run.dir={tmp_path}", *legacy])
    entry.main()
    assert in_process == [0], "ended at once with exit code 0"
    assert os.environ["LOCAL_RANK"] == "0", "the legacy argument's value, where torchrun would have put it"
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [record["kind"] for record in records][-1] == "val" and records[-1]["val_samples"] == 16
    assert (tmp_path / FINISHED_MARKER).read_text().strip() == "3", "3 steps of 16 samples"
    assert (tmp_path / "checkpoints" / "step_00000003.pt").is_file()


def test_a_mistake_in_the_config_ends_in_one_line_with_exit_code_2(in_process, monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setattr(sys, "argv", ["train.py", *TINY, "trainer.epochs=0", f"hydra.run.dir={tmp_path}"])
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    assert stopped.value.code == 2 and in_process == []
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "trainer.epochs" in err and err.count("\n") == 1, err
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_sweep_under_torchrun_is_refused_before_hydra_runs(in_process, monkeypatch, capsys) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(sys, "argv", ["train.py", "-m", "seed=1,2"])
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    assert stopped.value.code == 2
    assert capsys.readouterr().err.startswith("error: -m under torchrun would make every rank run the whole sweep")

"""A checkpoint written by the code before the package's modules moved into folders (#34), kept in
tests/fixtures/before_the_move/: a tiny SmallCNN run of one epoch (3 steps). It still evaluates to the
figures its run logged, exports, and resumes: what a saved config names keeps working."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from {{cookiecutter.package_name}} import eval as entry
from {{cookiecutter.package_name}}.config import to_plain_dict, to_train_config
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.export import export

from .helpers import compose_config, cpu_env

FIXTURE = Path(__file__).parent / "fixtures" / "before_the_move" / "step_00000003.pt"
# Its run's last validation (metrics.jsonl), and val_macro_f1, a figure added since (of the same predictions).
LOGGED = "val_loss=2.333003 val_acc=0.062500 val_macro_f1=0.013072 val_samples=16"
RUN = ["model=small_cnn", "model.width=4", "data=synthetic", "data.train_size=48", "data.val_size=16",
       "data.batch_size=16", "data.image_size=8"]  # fmt: skip
pytestmark = pytest.mark.filterwarnings("ignore:Unable to enable fault handler:UserWarning")


def renamed(value: object, package: str) -> object:
    """The saved config's strings with the package named as this bake names it (the fixture was baked
    as ddp_project): the bytes of the old code's checkpoint otherwise."""
    if isinstance(value, dict):
        return {key: renamed(item, package) for key, item in value.items()}
    return value.replace("ddp_project.", f"{package}.") if isinstance(value, str) else value


@pytest.fixture
def old_run(tmp_path: Path) -> Path:
    payload = torch.load(FIXTURE, weights_only=True)
    payload["config"] = renamed(payload["config"], "{{cookiecutter.package_name}}")
    # The sinks this bake has (a bake without a sink has no key for it): not what moved.
    payload["config"]["log"] = to_plain_dict(to_train_config(compose_config(RUN)))["log"]
    # A part no owner of this project reads (a project made with more options wrote it): left alone.
    payload["part_of_another_project"] = {"start": 1, "git": None, "command": {"argv": ["train.py"]}}
    (tmp_path / "checkpoints").mkdir()
    torch.save(payload, tmp_path / "checkpoints" / FIXTURE.name)
    return tmp_path


def test_a_checkpoint_from_before_the_move_evaluates_exports_and_resumes(
    in_process, old_run: Path, monkeypatch, capsys, caplog
) -> None:
    checkpoint = old_run / "checkpoints" / FIXTURE.name
    monkeypatch.setattr(sys, "argv", ["eval.py", f"ckpt_path={checkpoint}"])
    entry.main()
    assert capsys.readouterr().out == LOGGED + "\n" and in_process == [0]
    export(checkpoint, old_run / "weights.safetensors")
    weights, saved = load_file(old_run / "weights.safetensors"), torch.load(checkpoint, weights_only=True)["model"]
    assert weights.keys() == saved.keys() and all(torch.equal(weights[name], saved[name]) for name in saved)
    caplog.set_level("INFO")
    resumed = build_trainer(to_train_config(compose_config([*RUN, "trainer.epochs=2"])), cpu_env(0, 1), old_run)
    assert resumed.state.step == 3 and resumed.state.epoch == 1, "it goes on from the old checkpoint"
    resumed.fit()
    assert resumed.state.step == 6 and (old_run / "checkpoints" / "step_00000006.pt").is_file()

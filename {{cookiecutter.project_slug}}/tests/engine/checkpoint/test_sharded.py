"""engine/checkpoint/sharded.py: a folder of shards holds the trained weights, read back whole; its
metadata is read without running code."""

from __future__ import annotations

import pickle
import re
import subprocess
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.engine.checkpoint.sharded import MetadataUnpickler, SafeReader, read_whole
from {{cookiecutter.package_name}}.models import SmallCNN

from ...helpers import PYTHON, run


@pytest.mark.slow
def test_a_sharded_checkpoint_round_trips_in_a_world_of_one(tmp_path: Path) -> None:
    """fsdp over one process (python train.py strategy=fsdp): the folder of shards holds the trained
    weights, read back whole; a ddp run of the same job trains the same weights."""
    job = ["task=classification", "model=small_cnn", "data=synthetic", "data.train_size=64", "data.val_size=20",
           "data.batch_size=16", "trainer.epochs=1", "checkpoint.every_n_steps=2"]  # fmt: skip
    runs = {}
    for strategy in ("fsdp", "ddp"):
        run_dir = tmp_path / strategy
        proc = run([PYTHON, "train.py", f"hydra.run.dir={run_dir}", f"strategy={strategy}", *job])
        runs[strategy] = re.findall(r"sha256 (\w+)", proc.stdout + proc.stderr)[-1]
    folder = tmp_path / "fsdp" / "checkpoints" / "step_00000004"
    whole = read_whole(folder)
    ddp = torch.load(tmp_path / "ddp" / "checkpoints" / "step_00000004.pt", weights_only=True)
    for name, tensor in ddp["model"].items():
        assert torch.allclose(whole["model"][name], tensor, atol=1e-6), name
    assert set(whole["optimizer"]["state"]) == {name for name, _ in SmallCNN(num_classes=10).named_parameters()}


def test_the_shards_metadata_is_read_without_running_code(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(tmp_path / "pwned")],))

    folder = tmp_path / "step_00000001"
    folder.mkdir()
    (folder / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(pickle.UnpicklingError, match="subprocess.call is not part of a checkpoint's metadata"):
        SafeReader(folder).read_metadata()
    assert not (tmp_path / "pwned").exists()
    with open(folder / ".metadata", "rb") as file, pytest.raises(pickle.UnpicklingError):
        MetadataUnpickler(file).load()

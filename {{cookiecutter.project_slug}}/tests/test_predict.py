"""predict.py in the package: a checkpoint's outputs over a data set, in this process and on two ranks:
ordered by index, each sample once, equal to a plain forward, the same file at any world size; its
mistakes in one line, before any work, nothing overwritten."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import initialize_config_dir
from torch.utils.data import default_collate

from {{cookiecutter.package_name}} import predict as entry
from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import compose_for_checkpoint, config_dir, register_configs, to_train_config
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer
from {{cookiecutter.package_name}}.engine.assembly.components import build_datasets, build_model
from {{cookiecutter.package_name}}.engine.assembly.entry import checkpoint_model
from {{cookiecutter.package_name}}.engine.checkpoint.files import load_checkpoint

from .helpers import compose_config, cpu_env, on_ranks

# @record wants a real stderr for faulthandler; under capsys it has none, which changes nothing here.
pytestmark = pytest.mark.filterwarnings("ignore:Unable to enable fault handler:UserWarning")

# 21 samples in batches of 4: a short last batch, and on 2 ranks 3 batches each.
TINY = ["model=small_cnn", "model.width=4", "data=synthetic", "data.train_size=24", "data.val_size=21",
        "data.batch_size=4", "data.image_size=8", "trainer.epochs=1"]  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("run")
    build_trainer(to_train_config(compose_config(TINY)), cpu_env(0, 1), run_dir).fit()
    return run_dir / "checkpoints" / "step_00000006.pt"


@pytest.fixture
def in_process_predict(in_process, monkeypatch) -> list[int]:
    monkeypatch.setattr(entry, "exit_now", in_process.append)
    return in_process


def predict(monkeypatch, capsys, *args: str) -> str:
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["predict.py", *args])
    entry.main()
    said = capsys.readouterr()
    return said.out + said.err


def plain_forward(checkpoint: Path, split: str) -> torch.Tensor:
    """The checkpoint's model on the split's samples in order, batched as the run batched them, in one process."""
    payload = load_checkpoint(checkpoint)
    model = build_model(payload["config"]["model"])
    model.load_state_dict(payload["model"])
    model.eval()
    train, val = build_datasets(payload["config"]["data"]["dataset"])
    dataset, size = (train, 24) if split == "train" else (val, 21)
    batches = [default_collate([dataset[index] for index in range(start, min(start + 4, size))])[0]
               for start in range(0, size, 4)]  # fmt: skip
    with torch.no_grad():
        return torch.cat([model(inputs) for inputs in batches])


@pytest.mark.parametrize(("split", "predict_as"), [("val", None), ("train", "probs"), ("val", "class")])
def test_the_file_holds_every_sample_once_in_order_as_a_plain_forward_computes_it(
    in_process_predict, checkpoint, tmp_path, monkeypatch, capsys, split: str, predict_as: str | None
) -> None:
    out = tmp_path / "predictions" / "val.pt"
    given = [f"split={split}"] + ([f"predict_as={predict_as}"] if predict_as else [])
    said = predict(monkeypatch, capsys, f"ckpt_path={checkpoint}", f"out={out}", *given)
    written = torch.load(out, weights_only=True)
    size = 24 if split == "train" else 21
    assert set(written) == {"indices", "outputs"} and torch.equal(written["indices"], torch.arange(size))
    logits = plain_forward(checkpoint, split)
    expected = {None: logits, "probs": torch.softmax(logits, dim=1), "class": logits.argmax(dim=1)}[predict_as]
    assert written["outputs"].dtype == expected.dtype and torch.equal(written["outputs"], expected)
    assert f"the {split} set's {size} samples" in said and in_process_predict == [0]
    assert [path.name for path in out.parent.iterdir()] == ["val.pt"], "no temporary file left beside it"


def predictions_on_rank(env, jobs: list[tuple[object, str]], checkpoint: Path) -> None:  # noqa: ANN001
    """What predict.py does in a worker once its process group exists, for each (config, out)."""
    payload = load_checkpoint(checkpoint)
    for config, out in jobs:
        entry.write_predictions(checkpoint_model(checkpoint, payload, config, env.device), config, env, Path(out))


@pytest.mark.slow
def test_two_ranks_write_the_file_one_rank_writes_bit_for_bit(checkpoint, tmp_path) -> None:
    """Also where a rank has no batch at all (8 samples in one batch of 32: rank 0's share is empty)."""
    register_configs()
    saved = load_checkpoint(checkpoint)["config"]
    jobs: dict[int, list[tuple[object, str]]] = {1: [], 2: []}
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        for ranks in jobs:
            for name, overrides in (("whole", []), ("one_batch", ["data.val_size=8", "data.batch_size=32"])):
                out = str(tmp_path / f"{name}_{ranks}.pt")
                config = to_train_config(compose_for_checkpoint(saved, [f"ckpt_path={checkpoint}", f"out={out}",
                                                                        *overrides], "predict"))  # fmt: skip
                jobs[ranks].append((config, out))
    for ranks, given in jobs.items():
        on_ranks(ranks, predictions_on_rank, given, checkpoint)
    for name, size in (("whole", 21), ("one_batch", 8)):
        one, two = (tmp_path / f"{name}_1.pt").read_bytes(), (tmp_path / f"{name}_2.pt").read_bytes()
        assert one == two, name
        assert torch.equal(torch.load(tmp_path / f"{name}_2.pt", weights_only=True)["indices"], torch.arange(size))


class Pair(torch.nn.Module):
    """A model whose outputs are not one tensor (a pair of them, as some models return)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model(inputs), inputs


def pair_on_rank(env, config: object, checkpoint: Path, out: str) -> str:  # noqa: ANN001
    model = Pair(checkpoint_model(checkpoint, load_checkpoint(checkpoint), config, env.device))  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as refused:
        entry.write_predictions(model, config, env, Path(out))  # type: ignore[arg-type]
    return str(refused.value)


def test_outputs_that_are_not_a_tensor_are_refused_on_every_rank_also_one_without_a_batch(checkpoint, tmp_path) -> None:
    register_configs()
    saved, out = load_checkpoint(checkpoint)["config"], str(tmp_path / "p.pt")
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        overrides = [f"ckpt_path={checkpoint}", f"out={out}", "data.val_size=8", "data.batch_size=32"]
        config = to_train_config(compose_for_checkpoint(saved, overrides, "predict"))
    said = "the model's outputs are tuple, not a tensor: give the task a predict method that makes one of them"
    said += " (tasks/__init__.py)"
    assert on_ranks(2, pair_on_rank, config, checkpoint, out) == [said] * 2  # rank 0 has no batch
    assert not Path(out).exists()


def doctored(checkpoint: Path, tmp_path: Path) -> Path:
    """A copy of a real checkpoint whose model names code from outside the project."""
    payload = load_checkpoint(checkpoint)
    payload["config"]["model"]["_target_"] = "payload_module.Payload"
    path = tmp_path / "step_00000006.pt"
    torch.save(payload, path)
    return path


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("no out", "out is required: give out=FILE.pt"),
        ("no ckpt_path", "ckpt_path is required: give ckpt_path=<run>/checkpoints/step_<N>.pt"),
        ("exists", "out={out} exists: give another output path (nothing is overwritten)"),
        ("doctored", "the checkpoint's config names model._target_=payload_module.Payload, which no config of this"),
        ("split=test", "split='test' is not one of val, train"),
        ("predict_as=token", "predict_as=token: task._target_={{ cookiecutter.package_name }}.tasks.Classification saves one"),
        ("out=https://host/p.pt", "out=https://host/p.pt: predictions are written to this machine's disk"),
        ("out under a file", "out={out} cannot be written ({out.parent} is not a folder): give a path in a folder"),
        ("ckpt_path=https://host/c.pt", "ckpt_path=https://host/c.pt: a checkpoint is read from this machine's disk"),
    ],
)
def test_a_mistake_is_refused_in_one_line_and_nothing_is_written(
    in_process_predict, checkpoint, tmp_path, monkeypatch, capsys, case: str, said: str
) -> None:
    out = tmp_path / "predictions.pt"
    given = [f"ckpt_path={checkpoint}", f"out={out}"]
    monkeypatch.setattr(entry, "predict", lambda *args: pytest.fail("a batch ran before the refusal"))
    if case == "out under a file":  # a folder that cannot be made: found before the first batch, not after the last
        (tmp_path / "notes").write_text("")
        out = tmp_path / "notes" / "p.pt"
        given[1] = f"out={out}"
    elif case == "exists":
        out.write_bytes(b"earlier predictions")
    elif case in ("no out", "no ckpt_path"):
        given.pop(1 if case == "no out" else 0)
    elif case == "doctored":
        given[0] = f"ckpt_path={doctored(checkpoint, tmp_path)}"
    else:  # the key given, in place of the valid one
        given = [item for item in given if item.split("=")[0] != case.split("=")[0]] + [case]
    with pytest.raises(SystemExit) as stopped:
        predict(monkeypatch, capsys, *given)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and in_process_predict == []
    assert err.startswith("error: " + said.format(out=out)) and err.count("\n") == 1, err
    assert not out.exists() or out.read_bytes() == b"earlier predictions"
    if case == "doctored":
        assert err.rstrip().endswith("with trust_checkpoint=true")


def test_a_killed_predicts_temporary_is_removed_at_the_next_start_but_not_a_live_ones(
    in_process_predict, checkpoint, tmp_path, monkeypatch, capsys
) -> None:
    """A predict killed while writing leaves `.tmp_<name>.<pid>`: the next predict to the same file removes it
    where its process is gone, and leaves one of a live process (a predict writing now) and other files'."""
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    out = tmp_path / "val.pt"
    stale, live, other = (tmp_path / f".tmp_{name}.{pid}" for name, pid in
                          (("val.pt", gone.pid), ("val.pt", os.getppid()), ("train.pt", gone.pid)))  # fmt: skip
    for path in (stale, live, other):
        path.write_bytes(b"half a file")
    predict(monkeypatch, capsys, f"ckpt_path={checkpoint}", f"out={out}")
    assert in_process_predict == [0] and not stale.exists() and live.exists() and other.exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([live.name, other.name, "val.pt"])


@pytest.mark.parametrize(("size", "batch_size"), [(21, 4), (8, 32), (3, 1), (40, 8)])
def test_every_world_size_from_1_to_4_runs_the_batches_of_one_process(size: int, batch_size: int) -> None:
    """What makes the file the same at any world size: the ranks' shards, in rank order, are the one-process
    run's batches, whole; padded outputs joined per rank then on rank 0 are those joined at once."""
    one = [range(start, min(start + batch_size, size)) for start in range(0, size, batch_size)]
    outputs = [torch.full((len(batch), 2 + number % 5), float(number)) for number, batch in enumerate(one)]
    lengths = [torch.full((len(output),), output.shape[1]) for output in outputs]
    whole = entry.joined(outputs, lengths)  # type: ignore[arg-type]
    for world_size in range(1, 5):
        shards = [entry.batch_shard(size, batch_size, rank, world_size) for rank in range(world_size)]
        assert [index for shard in shards for index in shard] == list(range(size))
        assert all(shard.start % batch_size == 0 for shard in shards if len(shard)), "whole batches only"
        counts = [len(shard) // batch_size + (len(shard) % batch_size > 0) for shard in shards]
        bounds = [sum(counts[:rank]) for rank in range(world_size + 1)]
        pieces = [entry.joined(outputs[first:last], lengths[first:last])
                  for first, last in itertools.pairwise(bounds) if last > first]  # fmt: skip
        joined = entry.joined([piece[0] for piece in pieces], [piece[1] for piece in pieces])  # type: ignore[misc]
        assert torch.equal(joined[0].nan_to_num(-1), whole[0].nan_to_num(-1)) and torch.equal(joined[1], whole[1])

"""weights.py: a checkpoint's weights into a plain model (eval.py, the export), or a one-line refusal."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.engine.checkpoint.weights import has_ema, load_weights


def model(out_features: int = 3, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, out_features))


def write(path: Path, trained: nn.Module, **extra: object) -> None:
    torch.save({"model": trained.state_dict(), "step": 42, "format_version": 1, **extra}, path)


def test_the_weights_of_a_pt_checkpoint_go_into_the_plain_model(tmp_path: Path) -> None:
    trained = model(seed=1)
    trained.train()(torch.randn(16, 4))  # BatchNorm statistics that a fresh model lacks
    write(tmp_path / "step_00000042.pt", trained, epoch=3)
    fresh = model(seed=2)
    payload = load_weights(tmp_path / "step_00000042.pt", fresh)
    assert (payload["step"], payload["epoch"]) == (42, 3), "the payload comes back, loaded here"
    for (name, got), expected in zip(fresh.state_dict().items(), trained.state_dict().values(), strict=True):
        assert torch.equal(got, expected), name


def test_a_pt_checkpoint_with_an_ema_gives_its_average_parameters_and_the_models_buffers(tmp_path: Path) -> None:
    """A run with trainer.ema: eval.py and the export load what validation scored (the average's parameters,
    the trained model's buffers) and say so (has_ema); a run without one gives its plain weights."""
    trained, average = model(seed=1), model(seed=4)
    trained.train()(torch.randn(16, 4))
    parameters = {name: tensor for name, tensor in average.state_dict().items() if "running" not in name and
                  "num_batches" not in name}  # fmt: skip
    write(tmp_path / "ema.pt", trained, ema=parameters)
    write(tmp_path / "plain.pt", trained, ema={})
    fresh = model(seed=2)
    assert has_ema(tmp_path / "ema.pt", load_weights(tmp_path / "ema.pt", fresh))
    for name, tensor in fresh.state_dict().items():
        expected = parameters[name] if name in parameters else trained.state_dict()[name]
        assert torch.equal(tensor, expected), name
    assert not has_ema(tmp_path / "plain.pt", load_weights(tmp_path / "plain.pt", fresh))
    assert torch.equal(fresh[0].weight, trained[0].weight)


def test_a_given_payload_is_used_and_the_file_not_read_again(tmp_path: Path) -> None:
    write(tmp_path / "step_00000042.pt", model(seed=1))
    other = model(seed=3)
    fresh = model(seed=2)
    given = {"model": other.state_dict(), "step": 42}
    assert load_weights(tmp_path / "step_00000042.pt", fresh, given) is given
    assert torch.equal(fresh[0].weight, other[0].weight)


def test_a_model_the_checkpoint_does_not_fit_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "step_00000042.pt"
    write(path, model(out_features=3))
    with pytest.raises(ConfigError) as refused:
        load_weights(path, model(out_features=5))
    message = str(refused.value)
    assert message.startswith(f"checkpoint {path} does not fit this model: ") and "2.weight" in message
    head = f"checkpoint {path} does not fit this model: "
    assert "\n" not in message and len(message) <= len(head) + 300, "torch's story cut to one short line"


def test_a_checkpoint_of_a_newer_format_is_refused_before_its_weights_are_read(tmp_path: Path) -> None:
    path = tmp_path / "step_00000042.pt"
    write(path, model(seed=1), format_version=2)
    fresh = model(seed=2)
    before = {name: tensor.clone() for name, tensor in fresh.state_dict().items()}
    with pytest.raises(ConfigError) as refused:
        load_weights(path, fresh)
    assert str(refused.value) == (f"checkpoint {path} has format version 2, newer than this code's 1: update the "
                                  "project's code to the version that wrote it, or start a new run dir")  # fmt: skip
    assert all(torch.equal(fresh.state_dict()[name], tensor) for name, tensor in before.items()), "untouched"

"""engine/init_weights.py: model.init_from's weights from any file a user has (a run's checkpoint, an
export, a plain or wrapped state_dict), what does not fit named in one line, read by rank 0 alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from {{cookiecutter.package_name}}.engine.init_weights import fit_weights, initialise_from, read_weights
from {{cookiecutter.package_name}}.errors import ConfigError
from {{cookiecutter.package_name}}.placement import DistEnv

from ..helpers import CPU, on_ranks


def net(classes: int) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, classes))


@pytest.mark.parametrize("wrap", ["plain", "checkpoint", "state_dict", "ddp_prefix"])
def test_weights_are_read_from_the_files_users_have(tmp_path: Path, wrap: str) -> None:
    weights = net(10).state_dict()
    payload = {
        "plain": weights,
        "checkpoint": {"model": weights, "optimizer": {"state": {}}, "step": 3},
        "state_dict": {"state_dict": weights, "epoch": 1},
        "ddp_prefix": {f"module.{k}": v for k, v in weights.items()},
    }[wrap]
    torch.save(payload, tmp_path / "w.pt")
    read = read_weights(tmp_path / "w.pt")
    assert read.keys() == weights.keys() and all(torch.equal(read[k], weights[k]) for k in weights)


def test_a_new_head_keeps_its_initialisation_and_is_named_in_one_line() -> None:
    source, target = net(10), net(3)
    head = target[2].weight.detach().clone()
    line = fit_weights(target, source.state_dict())
    assert line == ("7 of 9 tensors loaded; skipped, shape differs: 2.weight [10, 8]->[3, 8], 2.bias [10]->[3]")
    assert torch.equal(target[0].weight, source[0].weight) and torch.equal(target[2].weight, head)
    assert torch.equal(target[1].running_mean, source[1].running_mean), "buffers too"
    other = {"0.weight": source[0].weight, "extra.weight": torch.zeros(1)}
    line = fit_weights(net(3), other)
    assert line.startswith("1 of 9 tensors loaded; not in the file, initialised afresh: 0.bias, 1.weight, 1.bias, ")
    assert line.endswith("and 4 more; in the file, not in the model: extra.weight")


def test_what_cannot_be_weights_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model.init_from=.*nothing.pt: no such file or folder"):
        read_weights(tmp_path / "nothing.pt")
    torch.save({"lr": 0.1}, tmp_path / "plain.pt")
    with pytest.raises(ConfigError, match=r"holds no state_dict \(names to tensors\)"):
        read_weights(tmp_path / "plain.pt")
    (tmp_path / "text.pt").write_text("not torch")
    with pytest.raises(ConfigError, match=r"does not load as tensors and plain values"):
        read_weights(tmp_path / "text.pt")
    with pytest.raises(ConfigError, match=r"none of its 1 tensors fits this model \(its names: other\)"):
        fit_weights(net(3), {"other": torch.zeros(2)})


def receive(env: DistEnv, path: str, has_checkpoint: bool) -> list[float] | str:
    torch.manual_seed(env.rank)  # each rank's own initialisation
    model = net(3)
    try:
        initialise_from(model, path, env, has_checkpoint=has_checkpoint and env.rank == 0)
    except ConfigError as error:
        return str(error)
    return model[0].weight.flatten().tolist()


def test_rank_zero_reads_the_file_and_the_others_receive_it(tmp_path: Path) -> None:
    torch.manual_seed(5)
    weights = net(10).state_dict()
    torch.save(weights, tmp_path / "w.pt")
    ranks = on_ranks(2, receive, str(tmp_path / "w.pt"), False)
    assert ranks[0] == ranks[1] == weights["0.weight"].flatten().tolist()
    ranks = on_ranks(2, receive, str(tmp_path / "missing.pt"), False)
    assert ranks[0] == ranks[1] and "no such file or folder" in ranks[0], "every rank raises rank 0's error"
    resumed = on_ranks(2, receive, str(tmp_path / "w.pt"), True)  # rank 0 holds the run's own checkpoint
    assert resumed[0] != weights["0.weight"].flatten().tolist() and resumed[1] != resumed[0], "nothing loaded"


def test_a_world_of_one_loads_without_a_process_group(tmp_path: Path, caplog) -> None:
    caplog.set_level("INFO")
    torch.save(net(10).state_dict(), tmp_path / "w.pt")
    initialise_from(net(3), str(tmp_path / "w.pt"), CPU, has_checkpoint=False)
    assert "initialised from" in caplog.text and "2.weight [10, 8]->[3, 8]" in caplog.text

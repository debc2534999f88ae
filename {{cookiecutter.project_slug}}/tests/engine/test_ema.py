"""engine/ema.py: the average after each step, the weights swapped in for a validation and back, its
state by parameter name (a whole tensor laid out as a live shard where a sharding strategy holds the
model)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.engine.ema import EMA, NoEMA, shard_like

from ..helpers import on_ranks


def linear() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))


def test_the_average_follows_the_weights_until_start_step_then_averages() -> None:
    model = linear()
    ema = EMA(model, decay=0.75, start_step=1)
    weight = model[0].weight
    with torch.no_grad():
        weight.fill_(1.0)
    ema.update(1)
    assert torch.equal(ema.average[0], weight), "until start_step: the weights themselves"
    with torch.no_grad():
        weight.fill_(3.0)
    ema.update(2)
    assert torch.allclose(ema.average[0], torch.full_like(weight, 0.75 * 1.0 + 0.25 * 3.0))
    assert len(ema.average) == len(list(model.parameters())), "parameters only: BatchNorm's buffers are the model's"


def test_validation_sees_the_average_and_training_its_own_weights_after() -> None:
    model = linear()
    ema = EMA(model, decay=0.5, start_step=0)
    own = model[0].weight.detach().clone()
    ema.average[0].fill_(7.0)
    with ema.swapped_in():
        assert torch.equal(model[0].weight, torch.full_like(own, 7.0))
    assert torch.equal(model[0].weight, own)
    with pytest.raises(RuntimeError), ema.swapped_in():
        raise RuntimeError("a failed validation")
    assert torch.equal(model[0].weight, own), "given back also when the validation fails"


def test_the_state_is_by_parameter_name_and_a_resume_without_one_starts_from_the_weights(tmp_path) -> None:
    model = linear()
    ema = EMA(model, decay=0.9, start_step=0)
    ema.average[0].fill_(5.0)
    torch.save(ema.state_dict(), tmp_path / "ema.pt")
    assert sorted(ema.state_dict()["ema"]) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    resumed = EMA(linear(), decay=0.9, start_step=0)
    resumed.load_state_dict(torch.load(tmp_path / "ema.pt", weights_only=True))
    assert torch.equal(resumed.average[0], torch.full_like(resumed.average[0], 5.0))
    later = linear()
    with torch.no_grad():
        later[0].weight.fill_(2.0)
    started = EMA(later, decay=0.9, start_step=0)
    started.average[0].zero_()
    started.load_state_dict({"step": 3})  # a checkpoint of a run without trainer.ema
    assert torch.equal(started.average[0], later[0].weight)
    assert NoEMA().state_dict() == {} and NoEMA().load_state_dict({}) is None


def shard_a_whole_tensor(env: DistEnv) -> list[float]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (env.world_size,))
    live = distribute_tensor(torch.zeros(4, 2), mesh, [Shard(0)])
    whole = torch.arange(8.0).view(4, 2)  # every rank holds it whole, as a ddp checkpoint gives it
    model = nn.Linear(2, 4, bias=False)
    ema = EMA(model, decay=0.5, start_step=0)
    ema.average = [live]
    ema.load_state_dict({"ema": {"weight": whole}})
    assert shard_like(live, live) is live
    return live.to_local().flatten().tolist()


@pytest.mark.slow
def test_a_whole_average_goes_into_each_ranks_shard_of_a_sharded_model() -> None:
    assert on_ranks(2, shard_a_whole_tensor) == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]

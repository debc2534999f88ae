"""engine/assembly/init_weights.py: model.init_from's weights from any file a user has (a run's checkpoint, an
export, a plain or wrapped state_dict), what does not fit named in one line, read by rank 0 alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.common.placement import DistEnv
from {{cookiecutter.package_name}}.engine.assembly.init_weights import fit_weights, initialise_from, read_weights
from {{cookiecutter.package_name}}.engine.checkpoint.files import list_checkpoints

from ...helpers import CPU, STRATEGIES, WIDEST, on_ranks


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


def receive_each(env: DistEnv, cases: list[tuple[str, bool]]) -> list[list[float] | str]:
    return [receive(env, path, has_checkpoint) for path, has_checkpoint in cases]  # one process group for all


def test_rank_zero_reads_the_file_and_the_others_receive_it(tmp_path: Path) -> None:
    torch.manual_seed(5)
    weights = net(10).state_dict()
    torch.save(weights, tmp_path / "w.pt")
    cases = [(str(tmp_path / "w.pt"), False), (str(tmp_path / "missing.pt"), False), (str(tmp_path / "w.pt"), True)]
    ranks, missing, resumed = zip(*on_ranks(2, receive_each, cases), strict=True)
    assert ranks[0] == ranks[1] == weights["0.weight"].flatten().tolist()
    assert missing[0] == missing[1] and "no such file or folder" in missing[0], "every rank raises rank 0's error"
    # rank 0 holds the run's own checkpoint: nothing loaded
    assert resumed[0] != weights["0.weight"].flatten().tolist() and resumed[1] != resumed[0]


def test_a_world_of_one_loads_without_a_process_group(tmp_path: Path, caplog) -> None:
    caplog.set_level("INFO")
    torch.save(net(10).state_dict(), tmp_path / "w.pt")
    initialise_from(net(3), str(tmp_path / "w.pt"), CPU, has_checkpoint=False)
    assert "initialised from" in caplog.text and "2.weight [10, 8]->[3, 8]" in caplog.text


def test_a_run_that_kept_an_ema_gives_its_average_and_says_so(tmp_path: Path, caplog) -> None:
    """As its validation, eval.py and the export do: the averaged parameters, the model's own buffers."""
    weights, average = net(3).state_dict(), {name: p.detach() + 1 for name, p in net(3).named_parameters()}
    torch.save({"model": weights, "ema": average, "step": 3}, tmp_path / "step_00000003.pt")
    with caplog.at_level("INFO"):
        read = read_weights(tmp_path / "step_00000003.pt")
    assert all(torch.equal(read[name], average[name]) for name in average)
    assert torch.equal(read["1.running_var"], weights["1.running_var"]) and read.keys() == weights.keys()
    assert "kept an EMA of its weights (trainer.ema): the average is taken" in caplog.text


def test_weights_of_which_only_buffers_fit_are_refused_in_one_line() -> None:
    """BatchNorm's counters fit any model: '1 of 9 tensors loaded' would hide that nothing learnt did."""
    other = nn.Sequential(nn.Linear(5, 16), nn.BatchNorm1d(16), nn.Linear(16, 2)).state_dict()
    with pytest.raises(ConfigError) as error:
        fit_weights(net(3), other)
    said = "model.init_from: of its 9 tensors only buffers fit this model (1.num_batches_tracked), no weight: give "
    assert str(error.value) == said + "weights of this model"


def test_a_url_is_refused_in_one_line_not_read_as_a_mangled_path() -> None:
    with pytest.raises(ConfigError) as error:
        initialise_from(net(3), "https://host/run/step_00000004.pt", CPU, has_checkpoint=False)
    message = str(error.value)
    assert message.startswith("model.init_from=https://host/run/step_00000004.pt: a checkpoint is read from this "
                              "machine's disk, not from a URL: copy it down first")  # fmt: skip
    assert message.endswith(" and give the local path") and "\n" not in message


JOB = ["model=small_cnn", "model.width=4", "data=synthetic", "data.train_size=16", "data.val_size=8",
       "data.batch_size=4", "data.image_size=8", "trainer.max_steps=2"]  # fmt: skip


def train(env: DistEnv, run_dir: Path, *overrides: str) -> dict[str, torch.Tensor]:
    """A tiny run; the weights it starts from (rank 0's, whole: every rank's are equal under ddp)."""
    from {{cookiecutter.package_name}}.config import to_train_config
    from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer

    from ...helpers import compose_config

    trainer = build_trainer(to_train_config(compose_config([*JOB, *overrides])), env, run_dir)
    started = {name: tensor.clone() for name, tensor in trainer.strategy.full_weights().items()}
    trainer.fit()
    return started


def fine_tune(env: DistEnv, sources: dict[str, Path], run_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    """A 3-class run under each strategy from its source (an export, or the checkpoint itself)."""
    return {strategy: train(env, run_dir / strategy, f"strategy={strategy}", "data.num_classes=3",
                            f"model.init_from={source}") for strategy, source in sources.items()}  # fmt: skip


@pytest.fixture(scope="module")
def ema_checkpoint(tmp_path_factory) -> Path:
    """A 10-class run's checkpoint (one rank, under the strategy whose checkpoints reach furthest: a folder of
    shards where the project has one), which kept an EMA of its weights."""
    run_dir = tmp_path_factory.mktemp("source")
    on_ranks(1, train, run_dir, f"strategy={WIDEST}", "trainer.ema.decay=0.5")
    return list_checkpoints(run_dir / "checkpoints")[0]


@pytest.mark.slow
def test_fine_tuning_under_each_strategy_starts_from_the_weights_but_the_new_head(ema_checkpoint, tmp_path) -> None:
    """Two ranks; under ddp from the checkpoint's .safetensors export, under each other strategy from the
    checkpoint itself."""
    from {{cookiecutter.package_name}}.export import export

    export(ema_checkpoint, tmp_path / "weights.safetensors")
    sources = {strategy: tmp_path / "weights.safetensors" if strategy == "ddp" else ema_checkpoint
               for strategy in STRATEGIES}  # fmt: skip
    started = on_ranks(2, fine_tune, sources, tmp_path)[0]
    expected = read_weights(ema_checkpoint)
    for strategy, weights in started.items():
        head = {name for name in weights if weights[name].shape != expected[name].shape}
        assert head == {"7.weight", "7.bias"}, (strategy, head)  # 10 classes -> 3: initialised afresh
        for name in weights.keys() - head:
            assert torch.equal(weights[name], expected[name]), (strategy, name)
        assert (tmp_path / strategy / "checkpoints").is_dir(), "and it trained"

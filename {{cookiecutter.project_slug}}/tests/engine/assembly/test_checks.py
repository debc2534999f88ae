"""engine/assembly/checks.py: what each node's first worker checks as it starts, before the process group forms
and before any work (the launcher's torch-free checks: tests/launch/test_checks.py): the data sets, the
`_target_`s that cannot work, the memory and the disk the job needs, the checkpoint a relaunch meets.
Each refusal is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import to_plain_dict, to_train_config
from {{cookiecutter.package_name}}.engine.assembly import checks as checks_module
from {{cookiecutter.package_name}}.engine.assembly.checks import check_components
from {{cookiecutter.package_name}}.tasks import Classification

from ...helpers import BagOfTokens, check_launch_for, compose_config, sequence_data

JOB = ["task=classification", "data=synthetic", "model=small_cnn"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data=cifar10", "data.root=/nonexistent"], "CIFAR-10 not found: /nonexistent/cifar-10-batches-py lacks"),
        (["data=image_folder", "data.root=/nonexistent"], "image_folder: /nonexistent/train does not exist"),
        (["checkpoint.resume=/nonexistent.pt"], "checkpoint.resume=/nonexistent.pt: no such file"),
        (["data.train_size=0"], "data.train_size must be >= 1, got 0"),
    ],
)
def test_what_needs_torch_is_refused_in_one_line_as_the_workers_start(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        check_launch_for([*JOB, *overrides], nproc=2)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_sync_batchnorm_on_several_cpu_processes_is_refused() -> None:
    job = [*JOB, "ddp.sync_batchnorm=true"]
    with pytest.raises(ConfigError, match=r"^ddp.sync_batchnorm=true needs GPUs .* runs 2 processes on CPUs: drop it"):
        check_launch_for(job, nproc=2)
    check_launch_for(job, nproc=1)  # one process: nothing to sync with


def test_more_processes_than_the_model_lets_memory_hold_are_refused(monkeypatch) -> None:
    monkeypatch.setattr(checks_module, "available_memory", lambda: 3 * 2**30)
    refused = (r"^NPROC_PER_NODE=64 would need about \d+\.\d GiB \(64 processes of about \d\.\d\d GiB, as the "
               r"first worker's model and batch took\) .* 3.0 GiB available: start at most \d+ ")  # fmt: skip
    with pytest.raises(ConfigError, match=refused):
        check_launch_for(JOB, nproc=64)
    check_launch_for(JOB, nproc=1)


def test_a_relaunch_with_overrides_the_checkpoint_cannot_take_is_refused(tmp_path: Path) -> None:
    """The multi-node case of a run name used again: what a finished or half-done run's checkpoint says."""
    job = [*JOB, "trainer.epochs=2", "data.train_size=1024"]
    plain = to_plain_dict(to_train_config(compose_config(job)))
    for epoch, samples, overrides, refusal in [
        (2, 0, ["optim.lr=0.01"], r"has finished \(epoch 2 of 2, step 32\) and would train nothing"),
        (1, 512, ["data.train_size=4096"], r"another sample order or data set \(data.train_size: checkpoint 1024"),
    ]:
        run_dir = tmp_path / f"run_{epoch}"
        (run_dir / "checkpoints").mkdir(parents=True)
        payload = {"format_version": 1, "model": {}, "optimizer": {}, "step": 32, "epoch": epoch,
                   "samples_in_epoch": samples, "config": plain}  # fmt: skip
        torch.save(payload, run_dir / "checkpoints" / "step_00000032.pt")
        with pytest.raises(ConfigError, match=refusal) as refused:
            check_launch_for([*job, *overrides], run_dir, nproc=2)
        assert f"checkpoint {run_dir / 'checkpoints' / 'step_00000032.pt'} " in str(refused.value), "which one"
        assert [path.name for path in (run_dir / "checkpoints").iterdir()] == ["step_00000032.pt"], "untouched"
        check_launch_for(job, run_dir, nproc=2)  # as launched before: fine
    # A checkpoint.dir another run owns (its .owner): refused in one line before torchrun, nothing written.
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / ".owner").write_text("/elsewhere/run\n")
    with pytest.raises(ConfigError, match=f"checkpoint.dir={shared} belongs to the run in /elsewhere/run "):
        check_launch_for([*job, f"checkpoint.dir={shared}"], tmp_path / "run_new", nproc=2)
    assert sorted(path.name for path in shared.iterdir()) == [".owner"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model._target_=nowhere.Model", "model._target_=nowhere.Model does not import (ModuleNotFoundError"),
        ("model._target_=torch.nn.Nope", "model._target_=torch.nn.Nope does not import (AttributeError"),
        ("model._target_=builtins.dict", "model._target_=builtins.dict returned a dict, not a torch.nn.Module"),
        ("data.dataset._target_=builtins.list", "data.dataset._target_=builtins.list failed: TypeError"),
        ("data.dataset._target_=builtins.dict", "data.dataset._target_=builtins.dict returned a dict, not a pair"),
        ("optim._target_=torch.optim.Nope", "optim._target_=torch.optim.Nope does not import"),
        ("task._target_={{cookiecutter.package_name}}.tasks.ClassificationWithAux", "model, data and task do not fit together"),
    ],
)
def test_a_target_that_cannot_work_is_refused_naming_the_key(override: str, message: str) -> None:
    config = to_train_config(compose_config(["data=synthetic", "model=small_cnn", override]))
    with pytest.raises(ConfigError) as error:
        check_components(config)
    assert message in str(error.value) and "\n" not in str(error.value)


def fails(items: list) -> None:
    raise ValueError(f"cannot pad {len(items)} items")


def test_items_that_do_not_stack_need_a_collate_that_works() -> None:
    """Sequences of 1 and 4 tokens (the first and last of 8): the one batch the workers' start runs."""
    config = to_train_config(compose_config(JOB))
    config.model = {"_target_": f"{BagOfTokens.__module__}.BagOfTokens"}
    dataset = {"_target_": sequence_data().dataset["_target_"], "train_size": 8}
    config.data = sequence_data(dataset=dataset, collate=None)
    does_not_stack = (
        r"stack expects each tensor to be equal size.*\): .* or give data.collate \(docs/configuration.md\)$"
    )
    with pytest.raises(ConfigError, match=r"^data.dataset: cannot batch its items \(RuntimeError: " + does_not_stack):
        check_components(config)
    config.data = sequence_data(dataset=dataset, collate={"_target_": f"{__name__}.fails"})
    failed = r"failed on a batch of 2 items \(ValueError: cannot pad 2 items\): it is called with a list of"
    with pytest.raises(ConfigError, match=rf"^data.collate._target_={__name__}.fails {failed}"):
        check_components(config)
    config.data = sequence_data(dataset=dataset)  # pad_sequences
    assert isinstance(check_components(config).model, BagOfTokens)


def test_a_disk_without_room_for_checkpoints_is_refused_before_training(tmp_path: Path, monkeypatch) -> None:
    import shutil

    from {{cookiecutter.package_name}}.engine.assembly.checks import check_room_for_checkpoints

    model = torch.nn.Linear(1000, 1000)  # 4 MB of weights: about 24 MB for checkpoints
    check_room_for_checkpoints(tmp_path / "run", model)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=10 * 2**20))
    with pytest.raises(ConfigError, match=r"has 10 MiB free, and checkpoints of this model need about 23 MiB"):
        check_room_for_checkpoints(tmp_path / "run", model)


class SummedLoss(Classification):
    """A task whose loss is a (total, count) pair: accepted."""

    def loss(self, logits, labels):  # noqa: ANN001, ANN201
        return super().loss(logits, labels).sum(), len(labels)


class CountOfShapeOne(Classification):
    """A count as a tensor of one element, not a scalar: the log line's sums cannot take it mid-run."""

    def loss(self, logits, labels):  # noqa: ANN001, ANN201
        return super().loss(logits, labels).sum(), torch.tensor([len(labels)])


class MetricCountOfShapeOne(SummedLoss):
    """The loss is fine; a validation metric's count is not (the validation would fail at its first batch)."""

    def metrics(self, logits, labels):  # noqa: ANN001, ANN201
        return {"loss": (super().loss(logits, labels), torch.ones(1))}


class ThreeValues(Classification):
    def loss(self, logits, labels):  # noqa: ANN001, ANN201
        return super().loss(logits, labels).sum(), len(labels), 0


def test_a_loss_is_one_value_per_sample_or_a_total_and_count_pair() -> None:
    def checked(task: str) -> None:
        overrides = ["data=synthetic", "model=small_cnn", f"task._target_={task}"]
        check_components(to_train_config(compose_config(overrides)))

    checked(f"{__name__}.SummedLoss")
    with pytest.raises(ConfigError, match=r"loss\(\) returned a tuple of 3: a pair must be \(total, count\)"):
        checked(f"{__name__}.ThreeValues")

    with pytest.raises(ConfigError) as refused:
        checked(f"{__name__}.CountOfShapeOne")
    assert str(refused.value) == (
        f"task._target_={__name__}.CountOfShapeOne: loss() returned a count of shape (1,): a pair's count must be a "
        "scalar, a 0-d tensor (e.g. mask.sum()) or a plain number"
    )
    with pytest.raises(ConfigError, match=r"MetricCountOfShapeOne: metrics\(\)\['loss'\] returned a count of shape "):
        checked(f"{__name__}.MetricCountOfShapeOne")

"""Every config group composes; wrong types and impossible values fail with a clear message."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from {{cookiecutter.package_name}}.config import ConfigError, to_train_config

from .conftest import PROJECT_DIR, compose_config, run

OPTIONS = [
    f"{group.name}={path.stem}"
    for group in sorted((PROJECT_DIR / "configs").iterdir())
    if group.is_dir()
    for path in sorted(group.glob("*.yaml"))
]


@pytest.mark.parametrize("choice", OPTIONS)
def test_every_group_option_composes_and_checks(choice: str) -> None:
    config = to_train_config(compose_config([choice]))
    group, name = choice.split("=")
    assert getattr(config, group).name == name


def test_defaults() -> None:
    config = to_train_config(compose_config())
    assert (config.model.name, config.data.name, config.optim.name) == (
        "{{ cookiecutter.default_model }}",
        "{{ cookiecutter.default_data }}",
        "sgd",
    )
    assert config.dist.backend == "auto" and config.checkpoint.resume == "auto"


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("data.batch_size=0", "data.batch_size"),
        ("ddp.bucket_cap_mb=0", "ddp.bucket_cap_mb"),
        ("ddp.bucket_cap_mb=-5", "ddp.bucket_cap_mb"),
        ("trainer.epochs=0", "trainer.epochs"),
        ("optim.lr=-0.1", "optim.lr"),
        ("model.name=vgg11", "model.name"),
        ("dist.backend=tcp", "dist.backend"),
        ("dist.timeout_s=0", "dist.timeout_s"),
        ("data.train_size=0", "data.train_size"),
        ("checkpoint.keep_last=0", "checkpoint.keep_last"),
        ("trainer.precision=fp8", "trainer.precision"),
        ("trainer.grad_accum_steps=0", "trainer.grad_accum_steps"),
        ("trainer.clip_grad_norm=-1", "trainer.clip_grad_norm"),
    ],
)
def test_impossible_values_fail_naming_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as error:
        to_train_config(compose_config(["data=synthetic", override]))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("override", ["data.batch_size=abc", "ddp.static_graph=maybe", "trainer.epochs=1.5"])
def test_wrong_types_fail_at_composition(override: str) -> None:
    with pytest.raises((HydraException, OmegaConfBaseException), match=override.split("=")[0].split(".")[-1]):
        compose_config([override])


def test_unknown_model_lists_the_choices() -> None:
    with pytest.raises(HydraException, match="resnet18"):
        compose_config(["model=vgg11"])


def outputs_snapshot() -> set[Path]:
    root = PROJECT_DIR / "outputs"
    return set(root.iterdir()) if root.exists() else set()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["data=synthetic", "data.batch_size=0"], "data.batch_size must be > 0"),
        (["data=synthetic", "ddp.bucket_cap_mb=0"], "ddp.bucket_cap_mb must be > 0"),
        (["data=synthetic", "dist.backend=nccl"], "dist.backend=nccl"),
        (["FOO=1"], "unknown key FOO"),
        (["NPROC_PER_NODE=two"], "NPROC_PER_NODE=two is not a whole number"),
        (["NPROC_PER_NODE=0"], "NPROC_PER_NODE=0 must be at least 1"),
        (["MAX_RESTARTS=-1"], "MAX_RESTARTS=-1 is not a whole number"),
        (["model=vgg11"], "Could not find 'model/vgg11'; choose one of: resnet18, resnet50, small_cnn"),
        (["data.batch_size=abc"], "Value 'abc' of type 'str' could not be converted to Integer"),
        (["trainer.epoch=3"], "To append to your config use +trainer.epoch=3"),
        (["data=cifar10", "data.root=/nonexistent"], "CIFAR-10 not found: /nonexistent/cifar-10-batches-py lacks"),
        (["data=image_folder", "data.root=/nonexistent"], "image_folder: /nonexistent/train does not exist"),
    ],
)
def test_launch_script_rejects_bad_input_before_torchrun(args: list[str], message: str) -> None:
    before = outputs_snapshot()
    proc = run(["bash", "scripts/run_single.sh", *args], expect_ok=False, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stderr.count("\n") == 1, "one line that says what is wrong and what to do"
    assert "Traceback" not in proc.stderr and "torch.distributed" not in proc.stdout
    assert outputs_snapshot() == before, "a rejected launch must not create a run dir"


def test_generated_names_are_interface() -> None:
    for name in ("train.py", "eval.py", "scripts/run_single.sh", "configs/train.yaml", "configs/eval.yaml"):
        assert (PROJECT_DIR / name).is_file(), name
    assert Path(PROJECT_DIR / "configs" / "model" / "small_cnn.yaml").is_file()

"""Every config group composes; wrong types and impossible values fail with a clear message."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from {{cookiecutter.package_name}}.components import target_of
from {{cookiecutter.package_name}}.config import ConfigError, to_train_config

from .helpers import PROJECT_DIR, compose_config

OPTIONS = [
    f"{group.name}={path.stem}"
    for group in sorted((PROJECT_DIR / "configs").iterdir())
    if group.is_dir()
    for path in sorted(group.glob("*.yaml"))
]


@pytest.mark.parametrize("choice", OPTIONS)
def test_every_group_option_composes_checks_and_names_a_callable(choice: str) -> None:
    language = ["task=language_model"] if choice in ("model=gpt", "data=text") else []  # they belong together
    config = to_train_config(compose_config([*language, choice]))
    for key, node in [("model", config.model), ("optim", config.optim), ("task", config.task),
                      ("data.dataset", config.data.dataset)]:  # fmt: skip
        assert callable(target_of(node, key)), key


def test_defaults() -> None:
    config = to_train_config(compose_config(classification=False))
{%- if cookiecutter.default_task == "language_model" %}
    assert config.task["_target_"].endswith("tasks.LanguageModel") and config.model["_target_"].endswith("GPT")
{%- else %}
    groups = ["model={{ cookiecutter.default_model }}", "data={{ cookiecutter.default_data }}", "optim=sgd"]
    chosen = to_train_config(compose_config(groups))
    assert (config.model, config.data, config.optim) == (chosen.model, chosen.data, chosen.optim)
    assert config.task["_target_"].endswith("tasks.Classification")
{%- endif %}
    assert config.dist.backend == "auto" and config.checkpoint.resume == "auto"


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("data.batch_size=0", "data.batch_size"),
        ("ddp.bucket_cap_mb=0", "ddp.bucket_cap_mb"),
        ("ddp.bucket_cap_mb=-5", "ddp.bucket_cap_mb"),
        ("trainer.epochs=0", "trainer.epochs"),
        ("optim.lr=-0.1", "optim.lr"),
        ("dist.backend=tcp", "dist.backend"),
        ("dist.timeout_s=0", "dist.timeout_s"),
        ("data.batch_size=abc", "data.batch_size"),
        ("data.augment=maybe", "data.augment"),
        ("optim.warmup_epochs=-1", "optim.warmup_epochs"),
        ("optim.scheduler=linear", "optim.scheduler"),
        ("model._target_=null", "model"),
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


@pytest.mark.parametrize("override", ["ddp.static_graph=maybe", "trainer.epochs=1.5"])
def test_wrong_types_fail_at_composition(override: str) -> None:
    with pytest.raises((HydraException, OmegaConfBaseException), match=override.split("=")[0].split(".")[-1]):
        compose_config([override])


def test_unknown_model_lists_the_choices() -> None:
    with pytest.raises(HydraException, match="resnet18"):
        compose_config(["model=vgg11"])


@pytest.mark.parametrize("override", ["+trainer.foo=3", "+seedx=1", "+checkpoint.every_n_step=5"])
def test_a_key_outside_the_schema_is_refused_not_ignored(override: str) -> None:
    key = override.lstrip("+").split("=")[0]
    with pytest.raises(ConfigError, match=f"{key} is not a setting of this project"):
        to_train_config(compose_config([override]))
    to_train_config(compose_config(["+model.dropout_rate=0.1"]))  # the groups are open: a callable's argument


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("ddp.comm_hook=int8", "ddp.comm_hook"),
        ("ddp.powersgd_rank=0", "ddp.powersgd_rank"),
        ("ddp.powersgd_start_iter=1", "ddp.powersgd_start_iter must be >= 2"),
    ],
)
def test_bad_comm_hook_settings_are_refused_naming_the_key(override: str, message: str) -> None:
    # The launch script's refusal of these (tests/e2e/test_comm_hooks.py) is in the slow set: here in-process.
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        to_train_config(compose_config([override]))
    assert "\n" not in str(error.value)


def test_generated_names_are_interface() -> None:
    for name in ("train.py", "eval.py", "scripts/run_single.sh", "configs/train.yaml", "configs/eval.yaml"):
        assert (PROJECT_DIR / name).is_file(), name
    assert Path(PROJECT_DIR / "configs" / "model" / "small_cnn.yaml").is_file()

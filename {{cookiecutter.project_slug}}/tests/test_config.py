"""Every config group composes; wrong types and impossible values fail with a clear message."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from {{cookiecutter.package_name}}.components import target_of
from {{cookiecutter.package_name}}.config import ConfigError, to_train_config

from .conftest import PROJECT_DIR, compose_config, run

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


def outputs_snapshot() -> set[Path]:
    root = PROJECT_DIR / "outputs"
    return set(root.iterdir()) if root.exists() else set()


@pytest.mark.parametrize(
    ("args", "message"),
    [  # one of each kind, through the script; test_launch.py checks every case in-process
        (["data=synthetic", "data.batch_size=0"], "data.batch_size must be a whole number >= 1, got 0"),
        (["NPROC_PER_NODE=two"], "NPROC_PER_NODE=two is not a whole number"),
        (["model=vgg11"], "Could not find 'model/vgg11'; choose one of: gpt, resnet18, resnet50, small_cnn"),
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

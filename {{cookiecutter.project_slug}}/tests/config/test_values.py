"""config/values.py: the rules a value is checked by (an impossible value is one line naming its key),
and where the project's files are."""

from __future__ import annotations

from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config import to_train_config

from ..helpers import PROJECT_DIR, compose_config


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
        ("scheduler.warmup_epochs=-1", "scheduler.warmup_epochs"),
        ("scheduler.warmup_steps=1.5", "scheduler.warmup_steps"),
        ("scheduler=constant scheduler._target_=null", "scheduler"),
        ("trainer.max_steps=-1", "trainer.max_steps"),
        ("trainer.val_every_n_steps=-2", "trainer.val_every_n_steps"),
        ("trainer.early_stop_patience=-1", "trainer.early_stop_patience"),
        ("trainer.early_stop_min_delta=-0.1", "trainer.early_stop_min_delta"),
        ("trainer.ema.decay=1", "trainer.ema.decay"),
        ("trainer.ema.start_step=-1", "trainer.ema.start_step"),
        ("checkpoint.keep_best=-1", "checkpoint.keep_best"),
        ("checkpoint.mode=lowest", "checkpoint.mode"),
        ("checkpoint.monitor=loss", "checkpoint.monitor"),
        ("model.init_from=w.pt checkpoint.resume=other/step_00000001.pt", "model.init_from"),
        ("model._target_=null", "model"),
        ("checkpoint.keep_last=0", "checkpoint.keep_last"),
        ("trainer.precision=fp8", "trainer.precision"),
        ("trainer.grad_accum_steps=0", "trainer.grad_accum_steps"),
        ("trainer.clip_grad_norm=-1", "trainer.clip_grad_norm"),
    ],
)
def test_impossible_values_fail_naming_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as error:
        to_train_config(compose_config(["data=synthetic", *override.split()]))
    assert "\n" not in str(error.value)


def test_generated_names_are_interface() -> None:
    for name in ("train.py", "eval.py", "scripts/run_single.sh", "configs/train.yaml", "configs/eval.yaml"):
        assert (PROJECT_DIR / name).is_file(), name
    assert Path(PROJECT_DIR / "configs" / "model" / "small_cnn.yaml").is_file()

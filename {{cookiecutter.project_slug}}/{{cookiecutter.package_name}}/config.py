"""Typed schema of the configuration: types and rules live here, values live in configs/*.yaml.

Every yaml file under configs/ extends one of these dataclasses, so Hydra rejects a wrong
type at composition time, and `to_train_config` runs each section's `check()` before any
process group exists, identically on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


class ConfigError(ValueError):
    """A user mistake in the configuration or the launch; reported as one line, no traceback."""


def require(condition: bool, message: str) -> None:
    """Raise ConfigError(message) unless condition holds."""
    if not condition:
        raise ConfigError(message)


def require_positive(key: str, value: float) -> None:
    require(value > 0, f"{key} must be > 0, got {value}: set {key}=<positive number>")


def require_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    require(value in choices, f"{key}={value!r} is not one of {', '.join(choices)}")


MODEL_NAMES = ("small_cnn", "resnet18", "resnet50")
DATA_NAMES = ("synthetic", "image_folder", "cifar10")
IN_MEMORY_DATA = ("synthetic", "cifar10")
BACKENDS = ("auto", "nccl", "gloo", "mpi")
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class ModelConfig:
    name: str = MISSING

    def check(self) -> None:
        require_choice("model.name", self.name, MODEL_NAMES)


@dataclass
class SmallCNNConfig(ModelConfig):
    width: int = MISSING

    def check(self) -> None:
        super().check()
        require_positive("model.width", self.width)


@dataclass
class DataConfig:
    name: str = MISSING
    batch_size: int = MISSING  # per process
    num_workers: int = MISSING
    num_classes: int = MISSING
    image_size: int = MISSING
    augment: bool = MISSING  # random crop (padding 4) and horizontal flip
    on_device: bool = MISSING  # keep the training set on the GPU and augment batches there

    def check(self) -> None:
        require_choice("data.name", self.name, DATA_NAMES)
        require(
            not self.on_device or self.name in IN_MEMORY_DATA,
            f"data.on_device=true needs a data set held in memory ({', '.join(IN_MEMORY_DATA)}), not {self.name}",
        )
        require_positive("data.batch_size", self.batch_size)
        require(self.num_workers >= 0, f"data.num_workers must be >= 0, got {self.num_workers}")
        require(self.num_classes >= 2, f"data.num_classes must be >= 2, got {self.num_classes}")
        require(self.image_size >= 8, f"data.image_size must be >= 8, got {self.image_size}")


@dataclass
class SyntheticDataConfig(DataConfig):
    train_size: int = MISSING
    val_size: int = MISSING

    def check(self) -> None:
        super().check()
        require_positive("data.train_size", self.train_size)
        require_positive("data.val_size", self.val_size)


@dataclass
class ImageFolderDataConfig(DataConfig):
    root: str = MISSING  # holds train/<class>/* and val/<class>/*


@dataclass
class Cifar10DataConfig(DataConfig):
    root: str = MISSING  # holds cifar-10-batches-py/
    download: bool = MISSING


@dataclass
class OptimConfig:
    name: str = MISSING
    lr: float = MISSING
    weight_decay: float = MISSING
    scheduler: str = MISSING  # cosine | constant, over the whole run, after warm-up
    warmup_epochs: float = MISSING

    def check(self) -> None:
        require_positive("optim.lr", self.lr)
        require(self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        require_choice("optim.scheduler", self.scheduler, ("cosine", "constant"))
        require(self.warmup_epochs >= 0, f"optim.warmup_epochs must be >= 0, got {self.warmup_epochs}")


@dataclass
class SGDConfig(OptimConfig):
    momentum: float = MISSING
    nesterov: bool = MISSING


@dataclass
class AdamWConfig(OptimConfig):
    betas: list[float] = MISSING

    def check(self) -> None:
        super().check()
        require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            f"optim.betas must be two numbers in [0, 1), got {list(self.betas)}",
        )


@dataclass
class TrainerConfig:
    epochs: int = MISSING
    log_every_n_steps: int = MISSING
    record_samples: bool = MISSING  # logs/samples_rank_<R>.jsonl: the sample indices of every step
    precision: str = MISSING  # fp32 | bf16 (autocast) | fp16 (autocast and a GradScaler)
    channels_last: bool = MISSING
    compile: bool = MISSING  # torch.compile of the model, before the DDP wrap
    grad_accum_steps: int = MISSING  # micro-batches per optimizer step, all-reduced once
    clip_grad_norm: float = MISSING  # 0: no clipping
    deterministic: bool = MISSING  # deterministic kernels on GPUs: bit-exact resume there, at a cost

    def check(self) -> None:
        require_positive("trainer.epochs", self.epochs)
        require_positive("trainer.log_every_n_steps", self.log_every_n_steps)
        require_choice("trainer.precision", self.precision, PRECISIONS)
        require_positive("trainer.grad_accum_steps", self.grad_accum_steps)
        require(
            self.clip_grad_norm >= 0,
            f"trainer.clip_grad_norm must be >= 0 (0: off), got {self.clip_grad_norm}",
        )


@dataclass
class DDPConfig:
    bucket_cap_mb: float = MISSING
    gradient_as_bucket_view: bool = MISSING
    static_graph: bool = MISSING
    find_unused_parameters: bool = MISSING
    broadcast_buffers: bool = MISSING
    sync_batchnorm: bool = MISSING
    comm_hook: str = MISSING  # none | fp16 | bf16 | powersgd: see comm_hooks.py
    powersgd_rank: int = MISSING
    powersgd_start_iter: int = MISSING

    def check(self) -> None:
        require_positive("ddp.bucket_cap_mb", self.bucket_cap_mb)
        require_choice("ddp.comm_hook", self.comm_hook, COMM_HOOKS)
        require_positive("ddp.powersgd_rank", self.powersgd_rank)
        require(
            self.powersgd_start_iter >= 2,
            f"ddp.powersgd_start_iter must be >= 2 (PowerSGD needs plain steps first), got {self.powersgd_start_iter}",
        )


@dataclass
class DistConfig:
    backend: str = MISSING  # auto | nccl | gloo | mpi
    timeout_s: int = MISSING

    def check(self) -> None:
        require_choice("dist.backend", self.backend, BACKENDS)
        require_positive("dist.timeout_s", self.timeout_s)


@dataclass
class CheckpointConfig:
    every_n_steps: int = MISSING  # 0 saves only at epoch ends and at the end
    keep_last: int = MISSING
    resume: str = MISSING  # auto | never | <path to a checkpoint>

    def check(self) -> None:
        require(self.every_n_steps >= 0, f"checkpoint.every_n_steps must be >= 0, got {self.every_n_steps}")
        require_positive("checkpoint.keep_last", self.keep_last)


@dataclass
class LogConfig:
    all_ranks_console: bool = MISSING
{%- if cookiecutter.tensorboard == "yes" %}
    tensorboard: bool = MISSING
{%- endif %}


@dataclass
class TrainConfig:
    seed: int = MISSING
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)


@dataclass
class EvalConfig(TrainConfig):
    ckpt_path: str = MISSING


def register_configs() -> None:
    """Make the schemas available to the yaml files under configs/ (their `defaults: - base_*`)."""
    store = ConfigStore.instance()
    store.store(group="schema", name="train", node=TrainConfig, package="_global_")
    store.store(group="schema", name="eval", node=EvalConfig, package="_global_")
    for group, name, node in [
        ("model", "base_model", ModelConfig),
        ("model", "base_small_cnn", SmallCNNConfig),
        ("data", "base_synthetic", SyntheticDataConfig),
        ("data", "base_image_folder", ImageFolderDataConfig),
        ("data", "base_cifar10", Cifar10DataConfig),
        ("optim", "base_sgd", SGDConfig),
        ("optim", "base_adamw", AdamWConfig),
    ]:
        store.store(group=group, name=name, node=node)


def to_train_config(cfg: DictConfig) -> Any:
    """Turn Hydra's composed config into dataclass objects, running every range check.

    Interpolations are resolved here; a missing value or a failed check becomes a ConfigError.
    """
    try:
        config = OmegaConf.to_object(cfg)
    except Exception as error:  # OmegaConf's own errors carry the key in their message
        message = str(error).strip().splitlines()[0]
        raise ConfigError(f"invalid configuration: {message}") from None
    check_all(config)
    return config


def check_all(section: Any) -> None:
    """Run `check()` on a config dataclass and on every section inside it."""
    if hasattr(section, "check"):
        section.check()
    for item in fields(section):
        value = getattr(section, item.name)
        if is_dataclass(value):
            check_all(value)


def to_plain_dict(config: Any) -> dict[str, Any]:
    """The config as plain dicts, lists and scalars (what a weights_only checkpoint may hold)."""
    return OmegaConf.to_container(OmegaConf.structured(config), resolve=True)  # type: ignore[return-value]


CONFIG_GROUPS = ("model", "data", "optim")


def compose_for_checkpoint(saved: dict[str, Any], user_overrides: list[str]) -> DictConfig:
    """The eval config: the checkpoint's own settings, then whatever the user overrode.

    Evaluating a checkpoint needs the settings it was trained with (the model, the data set,
    the seed the synthetic set is drawn from); the user only names what should differ.
    """
    from hydra import compose

    given = {item.split("=", 1)[0].lstrip("+~") for item in user_overrides if "=" in item}
    choices = [f"{group}={saved[group]['name']}" for group in CONFIG_GROUPS if group not in given and group in saved]
    composed = compose(config_name="eval", overrides=choices + list(user_overrides))
    kept = OmegaConf.create({k: v for k, v in saved.items() if k not in given})
    for key in given:  # a dotted override (data.batch_size=...) keeps the user's value
        group, _, leaf = key.partition(".")
        if leaf and OmegaConf.select(kept, key) is not None:
            parent, _, name = key.rpartition(".")
            OmegaConf.select(kept, parent).pop(name)  # type: ignore[union-attr]
    return OmegaConf.merge(composed, kept)  # type: ignore[return-value]

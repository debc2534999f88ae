"""Typed schema of the configuration: types and rules live here; each key's default and its
one-line meaning live in configs/train.yaml (and the group files), nowhere else.

Every yaml file under configs/ extends one of these dataclasses, so Hydra rejects a wrong
type at composition time, and `to_train_config` runs each section's `check()` before any
process group exists, identically on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from .redaction import redact


def config_dir() -> Path:
    """configs/: inside the package once installed (`pip install .` puts it there), beside the
    package in a source checkout."""
    package = Path(__file__).resolve().parent
    inside = package / "configs"
    return inside if inside.is_dir() else package.parent / "configs"


class ConfigError(ValueError):
    """A user mistake in the configuration or the launch; reported as one line, no traceback."""


def first_line(error: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


class JobError(RuntimeError):
    """An error during training that no restart can fix (a diverged loss, a corrupt data file, a
    failed checkpoint write, nodes launched with other settings): the job stops once, with one line
    and `exit_code` (2: a mistake in the launch); the traceback goes to the rank's log file, and
    torchrun does not restart the workers."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def require(condition: bool, message: str) -> None:
    """Raise ConfigError(message) unless condition holds."""
    if not condition:
        raise ConfigError(message)


def require_positive(key: str, value: float) -> None:
    require(value > 0, f"{key} must be > 0, got {value}: set {key}=<positive number>")


def require_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    require(value in choices, f"{key}={value!r} is not one of {', '.join(choices)}")


BACKENDS = ("auto", "nccl", "gloo", "mpi")
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
PRECISIONS = ("fp32", "bf16", "fp16")
SCHEDULERS = ("cosine", "constant")
STRATEGIES = ("ddp", "fsdp")


def whole_number(key: str, value: Any, least: int) -> int:
    require(
        isinstance(value, int) and not isinstance(value, bool) and value >= least,
        f"{key} must be a whole number >= {least}, got {value!r}",
    )
    return value


def number(key: str, value: Any, least: float, strictly: bool = False) -> float:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    require(
        is_number and (value > least if strictly else value >= least),
        f"{key} must be a number {'>' if strictly else '>='} {least}, got {value!r}",
    )
    return float(value)


def flag(key: str, value: Any) -> bool:
    require(isinstance(value, bool), f"{key} must be true or false, got {value!r}")
    return value


def step_range(key: str, value: str) -> tuple[int, int] | None:
    """START:END, optimizer steps numbered as in metrics.jsonl (1: the first); "" is None (off)."""
    if value == "":
        return None
    first, colon, last = value.partition(":")
    require(
        colon == ":" and first.isdigit() and last.isdigit() and int(first) >= 1,
        f"{key}={value!r} is not START:END, steps numbered from 1: give e.g. {key}=5:8 (or 5:5 for one step)",
    )
    swapped = f"{max(int(last), 1)}:{first}"
    require(int(first) <= int(last), f"{key}={value}: START is after END; give START <= END, e.g. {key}={swapped}")
    return int(first), int(last)


def require_target(key: str, node: Any) -> None:
    require(
        isinstance(node, dict) and isinstance(node.get("_target_"), str),
        f"{key} needs a _target_ (a callable, module.name): see configs/{key.split('.')[0]}/",
    )


@dataclass
class DataConfig:
    """The loader's keys of a configs/data/*.yaml file. Its `dataset` node's `_target_` returns
    the (train, val) pair; any other key of the file is there for that node to interpolate."""

    batch_size: int  # per process
    num_workers: int
    dataset: dict[str, Any]
    num_classes: int = 0  # classification: the model's outputs; 0 where the task has no classes
    augment: bool = False  # the project's random crop (padding 4) and flip of image tensors
    on_device: bool = False  # keep the training set on the GPU and augment batches there
    node: dict[str, Any] = field(default_factory=dict)  # the whole data node, as configured

    @classmethod
    def from_node(cls, node: dict[str, Any]) -> DataConfig:
        require(isinstance(node, dict), "data must be a config node: choose one with data=<name>")
        require_target("data.dataset", node.get("dataset"))
        return cls(
            batch_size=whole_number("data.batch_size", node.get("batch_size"), 1),
            num_workers=whole_number("data.num_workers", node.get("num_workers", 0), 0),
            dataset=node["dataset"],
            num_classes=whole_number("data.num_classes", node["num_classes"], 2) if "num_classes" in node else 0,
            augment=flag("data.augment", node.get("augment", False)),
            on_device=flag("data.on_device", node.get("on_device", False)),
            node=node,
        )


def check_optim(node: Any) -> None:
    """optim: `_target_` (any torch.optim class) and its arguments, plus the project's schedule keys."""
    require_target("optim", node)
    number("optim.lr", node.get("lr"), 0, strictly=True)
    number("optim.weight_decay", node.get("weight_decay", 0.0), 0)
    require_choice("optim.scheduler", node.get("scheduler", "cosine"), SCHEDULERS)
    number("optim.warmup_epochs", node.get("warmup_epochs", 0.0), 0)
    if "betas" in node:
        betas = node["betas"]
        in_range = isinstance(betas, list) and all(isinstance(b, int | float) and 0 <= b < 1 for b in betas)
        require(in_range and len(betas) == 2, f"optim.betas must be two numbers in [0, 1), got {betas}")


@dataclass
class TrainerConfig:
    epochs: int = MISSING
    log_every_n_steps: int = MISSING
    record_samples: bool = MISSING
    precision: str = MISSING
    channels_last: bool = MISSING
    compile: bool = MISSING
    grad_accum_steps: int = MISSING
    clip_grad_norm: float = MISSING
    deterministic: bool = MISSING
    profile_steps: str = MISSING
    memory_snapshot: bool = MISSING

    def check(self) -> None:
        require_positive("trainer.epochs", self.epochs)
        require_positive("trainer.log_every_n_steps", self.log_every_n_steps)
        require_choice("trainer.precision", self.precision, PRECISIONS)
        require_positive("trainer.grad_accum_steps", self.grad_accum_steps)
        require(
            self.clip_grad_norm >= 0,
            f"trainer.clip_grad_norm must be >= 0 (0: off), got {self.clip_grad_norm}",
        )
        profiled = step_range("trainer.profile_steps", self.profile_steps)
        require(
            profiled is not None or not self.memory_snapshot,
            "trainer.memory_snapshot=true records the steps of trainer.profile_steps: set that too, e.g. "
            "trainer.profile_steps=5:8",
        )


@dataclass
class DDPConfig:
    bucket_cap_mb: float = MISSING
    gradient_as_bucket_view: bool = MISSING
    static_graph: bool = MISSING
    find_unused_parameters: bool = MISSING
    broadcast_buffers: bool = MISSING
    sync_batchnorm: bool = MISSING
    comm_hook: str = MISSING
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
class FSDPConfig:
    blocks: list[str] = MISSING
    reshard_after_forward: bool = MISSING
    cpu_offload: bool = MISSING


@dataclass
class DistConfig:
    backend: str = MISSING
    timeout_s: int = MISSING

    def check(self) -> None:
        require_choice("dist.backend", self.backend, BACKENDS)
        require_positive("dist.timeout_s", self.timeout_s)


@dataclass
class CheckpointConfig:
    every_n_steps: int = MISSING
    keep_last: int = MISSING
    resume: str = MISSING
    allow_changes: list[str] = MISSING

    def check(self) -> None:
        require(self.every_n_steps >= 0, f"checkpoint.every_n_steps must be >= 0, got {self.every_n_steps}")
        require_positive("checkpoint.keep_last", self.keep_last)


@dataclass
class LogConfig:
    all_ranks_console: bool = MISSING
{%- if cookiecutter.tensorboard == "yes" %}
    tensorboard: bool = MISSING
{%- endif %}
{%- if cookiecutter.mlflow == "yes" %}
    mlflow: bool = MISSING
    mlflow_tracking_uri: str = MISSING
    mlflow_experiment: str = MISSING
{%- endif %}
{%- if cookiecutter.wandb == "yes" %}
    wandb: bool = MISSING
    wandb_project: str = MISSING
    wandb_entity: str = MISSING
    wandb_mode: str = MISSING

    def check(self) -> None:
        require_choice("log.wandb_mode", self.wandb_mode, ("online", "offline"))
{%- endif %}


@dataclass
class TrainConfig:
    seed: int = MISSING
    model: Any = MISSING  # _target_ (returns an nn.Module) and its arguments
    data: Any = MISSING  # a DataConfig once checked
    optim: Any = MISSING  # _target_ (a torch.optim class) and its arguments; scheduler, warmup_epochs
    task: Any = MISSING  # _target_: the loss and the metrics (tasks.py)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    strategy: str = MISSING
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)

    def check(self) -> None:
        require_choice("strategy", self.strategy, STRATEGIES)
        if self.strategy == "fsdp":
            check_fsdp(self)


def check_fsdp(config: TrainConfig) -> None:
    """What strategy=fsdp cannot do: fp16's loss scaling, and the ddp.* options (which it would ignore)."""
    require(
        config.trainer.precision != "fp16",
        "trainer.precision=fp16 needs loss scaling, which strategy=fsdp does not do: use trainer.precision=bf16 "
        "(fp32's range, no scaling needed)",
    )
    defaults = OmegaConf.load(config_dir() / "train.yaml")["ddp"]
    for key, value in vars(config.ddp).items():
        require(
            defaults.get(key) == value,
            f"ddp.{key}={value} is a DDP option, and strategy=fsdp does not use it: drop it, or use strategy=ddp",
        )


@dataclass
class EvalConfig(TrainConfig):
    ckpt_path: str = MISSING


def register_configs() -> None:
    """Make the schemas available to the yaml files under configs/ (their `defaults: - base_*`)."""
    store = ConfigStore.instance()
    store.store(group="schema", name="train", node=TrainConfig, package="_global_")
    store.store(group="schema", name="eval", node=EvalConfig, package="_global_")


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """Turn Hydra's composed config into dataclass objects, running every range check.

    Interpolations are resolved here; a missing value or a failed check becomes a ConfigError.
    """
    try:
        config = OmegaConf.to_object(cfg)
    except Exception as error:  # OmegaConf's own errors carry the key in their message
        message = str(error).strip().splitlines()[0]
        raise ConfigError(f"invalid configuration: {message}") from None
    refuse_unknown_keys(cfg, config)
    require_target("model", config.model)
    require_target("task", config.task)
    check_optim(config.optim)
    config.data = DataConfig.from_node(config.data)
    check_all(config)
    return config


def refuse_unknown_keys(node: Any, section: Any, prefix: str = "") -> None:
    """A key the schema does not know (`+trainer.foo=3`) would be silently ignored: refuse it.
    The groups (model, data, optim, task) are open: their keys are the callable's arguments."""
    known = {item.name: getattr(section, item.name) for item in fields(section)}
    for key in node:
        if key not in known:
            raise ConfigError(
                f"{prefix}{key} is not a setting of this project: remove it, or see configs/train.yaml for the keys"
            )
        if is_dataclass(known[key]):
            refuse_unknown_keys(node[key], known[key], f"{prefix}{key}.")


def check_all(section: Any) -> None:
    """Run `check()` on a config dataclass and on every section inside it."""
    if hasattr(section, "check"):
        section.check()
    for item in fields(section):
        value = getattr(section, item.name)
        if is_dataclass(value):
            check_all(value)


def to_plain_dict(config: Any) -> dict[str, Any]:
    """The config as plain dicts, lists and scalars (what a weights_only checkpoint may hold):
    the groups as configured, so that the checkpoint's config composes again. What is written of a
    config (checkpoints, config.yaml, trackers) is this: credentials redacted (redaction.py)."""
    plain = OmegaConf.to_container(OmegaConf.structured(config), resolve=True)
    if isinstance(config.data, DataConfig):
        plain["data"] = config.data.node  # type: ignore[index]
    return redact(plain)


CONFIG_GROUPS = ("model", "data", "optim", "task")


def compose_for_checkpoint(saved: dict[str, Any], user_overrides: list[str]) -> DictConfig:
    """The eval config: the checkpoint's own settings, then whatever the user overrode.

    Evaluating a checkpoint needs the settings it was trained with (the model, the data set,
    the seed the synthetic set is drawn from); the user only names what should differ. The
    groups (model, data, optim, task) come back whole, as the checkpoint holds them.
    """
    from hydra import compose

    given = {item.split("=", 1)[0].lstrip("+~") for item in user_overrides if "=" in item}
    composed = compose(config_name="eval", overrides=list(user_overrides))
    merged = composed.copy()
    for section, value in saved.items():
        if section in given or section not in composed:
            continue
        if section in CONFIG_GROUPS:
            merged[section] = value
        else:
            merged = OmegaConf.merge(merged, {section: value})  # type: ignore[assignment]
    for key in given:  # a dotted override (data.batch_size=...) keeps the user's value
        if "." in key and key.split(".", 1)[0] not in given:
            OmegaConf.update(merged, key, OmegaConf.select(composed, key), merge=False)
    return merged

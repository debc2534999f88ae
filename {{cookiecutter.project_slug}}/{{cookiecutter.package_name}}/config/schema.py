"""Typed schema of the configuration: types and rules; each key's default and meaning live in configs/ alone.
Every yaml file there extends one of these dataclasses, so Hydra rejects a wrong type when it composes;
each section's `check()` runs before any work (compose.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import MISSING

from ..common.registry import modules_with
from .batches import global_batch_keys
from .strategies import STRATEGY_SECTIONS, check_strategy_options, with_strategy_sections
from .values import (
    BACKENDS,
    COMM_HOOKS,
    MONITOR_MODES,
    PRECISIONS,
    flag,
    number,
    require,
    require_choice,
    require_positive,
    require_target,
    train_defaults,
    whole_number,
)

# The modules that add settings to a section (each its SECTION_FIELDS and check_section), found by what is present.
FIELD_MODULES = tuple(module for module in modules_with(__package__, [str(Path(__file__).parent)], "SECTION_FIELDS")
                      if hasattr(module, "check_section"))  # fmt: skip
Section = TypeVar("Section")


def with_fields(section: str):  # noqa: ANN201 (a class decorator)
    """A dataclass-to-be with each field that FIELD_MODULES add to `section` (its type and default)."""

    def add(cls: type[Section]) -> type[Section]:
        for module in FIELD_MODULES:
            for name, (kind, default) in module.SECTION_FIELDS.get(section, {}).items():
                cls.__annotations__[name] = kind  # a type, not a string: OmegaConf resolves it as it is
                setattr(cls, name, default)
        return cls

    return add


def check_fields(section: str, config: Any) -> None:
    """The rules of the settings FIELD_MODULES add to `section`."""
    for module in FIELD_MODULES:
        module.check_section(section, config)


@dataclass
class DataConfig:
    """A configs/data/*.yaml file's loader keys: `dataset._target_` returns the (train, val) pair, others it reads."""

    batch_size: int  # per process (derived from global_batch_size where that is set: config/batches.py)
    num_workers: int
    dataset: dict[str, Any]
    num_classes: int = 0  # classification: the model's outputs; 0 where the task has no classes
    augment: bool = False  # the project's random crop (padding 4) and flip of image tensors
    on_device: bool = False  # keep the training set on the GPU and augment batches there
    collate: dict[str, Any] | None = None  # _target_: the user's batching of items that do not stack
    global_batch_size: int | None = None  # samples per optimizer step over every process, at any world size
    micro_batch_size: int | None = None  # with global_batch_size: the most a process runs at once
    val_sets: dict[str, Any] = field(default_factory=dict)  # name -> a data set node, validated as val_<name>_*
    test_set: dict[str, Any] | None = None  # a data set node evaluated once at the end of training: test_*
    node: dict[str, Any] = field(default_factory=dict)  # the whole data node, as configured

    @classmethod
    def from_node(cls, node: dict[str, Any]) -> DataConfig:
        require(isinstance(node, dict), "data must be a config node: choose one with data=<name>")
        require_target("data.dataset", node.get("dataset"))
        if node.get("collate") is not None:  # absent or null: torch's default collation
            require_target("data.collate", node["collate"])
        return cls(
            batch_size=whole_number("data.batch_size", node.get("batch_size"), 1),
            num_workers=whole_number("data.num_workers", node.get("num_workers", 0), 0),
            dataset=node["dataset"],
            num_classes=whole_number("data.num_classes", node["num_classes"], 2) if "num_classes" in node else 0,
            augment=flag("data.augment", node.get("augment", False)),
            on_device=flag("data.on_device", node.get("on_device", False)),
            collate=node.get("collate"),
            val_sets=node.get("val_sets") or {},  # data/loader.py checks these two
            test_set=node.get("test_set"),
            **global_batch_keys(node),
            node=node,
        )


def check_optim(node: Any) -> None:
    """optim: `_target_` (any torch.optim class) and its arguments."""
    require_target("optim", node)
    number("optim.lr", node.get("lr"), 0, strictly=True)
    number("optim.weight_decay", node.get("weight_decay", 0.0), 0)
    for moved in ("scheduler", "warmup_epochs"):  # the learning-rate schedule has its own group now
        require(
            moved not in node,
            f"optim.{moved} is now scheduler{'.warmup_epochs' if moved == 'warmup_epochs' else ''}: the schedule "
            "is its own group (scheduler=cosine | constant | your _target_, configs/scheduler/)",
        )
    if "betas" in node:
        betas = node["betas"]
        in_range = isinstance(betas, list) and all(isinstance(b, int | float) and 0 <= b < 1 for b in betas)
        require(in_range and len(betas) == 2, f"optim.betas must be two numbers in [0, 1), got {betas}")


def check_scheduler(node: Any) -> None:
    """scheduler: `_target_` (any learning-rate scheduler) and its arguments, plus the project's warm-up keys."""
    require_target("scheduler", node)
    number("scheduler.warmup_epochs", node.get("warmup_epochs", 0.0), 0)
    whole_number("scheduler.warmup_steps", node.get("warmup_steps", 0), 0)


@dataclass
class EMAConfig:
    decay: float = MISSING
    start_step: int = MISSING

    def check(self) -> None:
        require(0 <= self.decay < 1, f"trainer.ema.decay must be in [0, 1) (0: off), got {self.decay}: e.g. 0.999")
        require(self.start_step >= 0, f"trainer.ema.start_step must be >= 0, got {self.start_step}")


@dataclass
@with_fields("trainer")
class TrainerConfig:
    epochs: int = MISSING
    max_steps: int = MISSING
    val_every_n_steps: int = MISSING
    early_stop_patience: int = MISSING
    early_stop_min_delta: float = MISSING
    log_every_n_steps: int = MISSING
    record_samples: bool = MISSING
    precision: str = MISSING
    channels_last: bool = MISSING
    compile: bool = MISSING
    grad_accum_steps: int = MISSING
    clip_grad_norm: float = MISSING
    deterministic: bool = MISSING
    activation_checkpointing: bool = MISSING
    ema: EMAConfig = field(default_factory=EMAConfig)

    def check(self) -> None:
        require_positive("trainer.epochs", self.epochs)
        for key in ("max_steps", "val_every_n_steps", "early_stop_patience"):
            require(getattr(self, key) >= 0, f"trainer.{key} must be >= 0 (0: off), got {getattr(self, key)}")
        require(self.early_stop_min_delta >= 0, f"trainer.early_stop_min_delta must be >= 0, got "
                                                f"{self.early_stop_min_delta}")  # fmt: skip
        require_positive("trainer.log_every_n_steps", self.log_every_n_steps)
        require_choice("trainer.precision", self.precision, PRECISIONS)
        require_positive("trainer.grad_accum_steps", self.grad_accum_steps)
        require(self.clip_grad_norm >= 0, f"trainer.clip_grad_norm must be >= 0 (0: off), got {self.clip_grad_norm}")
        check_fields("trainer", self)


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
        require(self.powersgd_start_iter >= 2, "ddp.powersgd_start_iter must be >= 2 (PowerSGD needs plain steps "
                f"first), got {self.powersgd_start_iter}")  # fmt: skip


@dataclass
class DistConfig:
    backend: str = MISSING
    timeout_s: int = MISSING

    def check(self) -> None:
        require_choice("dist.backend", self.backend, BACKENDS)
        require_positive("dist.timeout_s", self.timeout_s)


@dataclass
@with_fields("checkpoint")
class CheckpointConfig:
    every_n_steps: int = MISSING
    keep_last: int = MISSING
    resume: str = MISSING
    allow_changes: list[str] = MISSING
    dir: str = ""  # where checkpoints go: "" for <run dir>/checkpoints, or a folder (a store's URL: with_fields)
    keep_best: int = MISSING
    monitor: str = MISSING
    mode: str = MISSING

    def check(self) -> None:
        require(self.every_n_steps >= 0, f"checkpoint.every_n_steps must be >= 0, got {self.every_n_steps}")
        require_positive("checkpoint.keep_last", self.keep_last)
        require(self.keep_best >= 0, f"checkpoint.keep_best must be >= 0 (0: off), got {self.keep_best}")
        require_choice("checkpoint.mode", self.mode, MONITOR_MODES)
        require(
            self.monitor.startswith("val_"),
            f"checkpoint.monitor={self.monitor!r} is not a validation figure: give val_<metric> as metrics.jsonl "
            "names it, e.g. val_loss or val_acc",
        )
        check_fields("checkpoint", self)


class LogConfig(dict):
    """The log section: the keys configs/train.yaml declares (`all_ranks_console`, the sinks' of observe/sinks/),
    of their types; another is refused. Read as attributes: `log.<key>`."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    @classmethod
    def from_node(cls, node: Any) -> LogConfig:
        declared = train_defaults()["log"]
        require(isinstance(node, dict), "log must be a config section: see configs/train.yaml for its keys")
        for key, value in node.items():
            require(key in declared, f"log.{key} is not a setting of this project: remove it, or see "
                                     "configs/train.yaml for the keys")  # fmt: skip
            kind = type(declared[key])
            require(
                isinstance(value, kind) and (kind is bool or not isinstance(value, bool)),
                f"log.{key} must be {'true or false' if kind is bool else f'a {kind.__name__}'}, got {value!r}",
            )
        return cls({**declared, **node})


@dataclass
@with_strategy_sections
class TrainConfig:
    seed: int = MISSING
    model: Any = MISSING  # _target_ (returns an nn.Module) and its arguments
    data: Any = MISSING  # a DataConfig once checked
    optim: Any = MISSING  # _target_ (a torch.optim class) and its arguments
    scheduler: Any = MISSING  # _target_ (a learning-rate scheduler) and its arguments; warmup_epochs, warmup_steps
    task: Any = MISSING  # _target_: the loss and the metrics (tasks/__init__.py)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: Any = MISSING  # a LogConfig once checked: its keys are train.yaml's
    strategy: str = MISSING
    trust_checkpoint: bool = False  # engine/checkpoint/trust.py
    callbacks: Any = field(default_factory=dict)  # name -> _target_ and its arguments (engine/callbacks.py)

    def check(self) -> None:
        require_choice("strategy", self.strategy, tuple(STRATEGY_SECTIONS))
        check_strategy_options(self)
        init_from = self.model.get("init_from") if isinstance(self.model, dict) else None
        require(
            not init_from or self.checkpoint.resume in ("auto", "never"),
            f"model.init_from={init_from} starts a new run from weights, and checkpoint.resume="
            f"{self.checkpoint.resume} continues another run: give one of them",
        )


@dataclass
class EvalConfig(TrainConfig):
    ckpt_path: str = MISSING

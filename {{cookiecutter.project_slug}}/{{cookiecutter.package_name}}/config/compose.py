"""From Hydra's composed config to checked dataclasses (to_train_config), and back to plain values
(to_plain_dict); a command's config from its checkpoint's (compose_for_checkpoint)."""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any, cast

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from ..common.errors import ConfigError
from ..common.redaction import redact
from ..common.registry import modules_with
from .commands import PredictConfig
from .schema import DataConfig, EvalConfig, LogConfig, TrainConfig, check_optim, check_scheduler
from .values import require_target


def register_configs() -> None:
    """Make the schemas available to the yaml files under configs/ (their `defaults: - base_*`)."""
    store = ConfigStore.instance()
    store.store(group="schema", name="train", node=TrainConfig, package="_global_")
    store.store(group="schema", name="eval", node=EvalConfig, package="_global_")
    store.store(group="schema", name="predict", node=PredictConfig, package="_global_")
    for module in modules_with(__package__, [str(Path(__file__).parent)], "SCHEMAS"):  # other commands' schemas
        for name, node in getattr(module, "SCHEMAS", {}).items():
            store.store(group="schema", name=name, node=node, package="_global_")


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """Hydra's composed config as checked dataclasses, interpolations resolved; any mistake a ConfigError."""
    try:
        config = cast(TrainConfig, OmegaConf.to_object(cfg))  # the structured schema's dataclass
    except Exception as error:  # OmegaConf's own errors carry the key in their message
        message = str(error).strip().splitlines()[0]
        raise ConfigError(f"invalid configuration: {message}") from None
    refuse_unknown_keys(cfg, config)
    require_target("model", config.model)
    require_target("task", config.task)
    for name, node in (config.callbacks or {}).items():
        require_target(f"callbacks.{name}", node)
    check_optim(config.optim)
    check_scheduler(config.scheduler)
    config.data = DataConfig.from_node(config.data)
    config.log = LogConfig.from_node(config.log)
    check_all(config)
    return config


def refuse_unknown_keys(node: Any, section: Any, prefix: str = "") -> None:
    """A key the schema does not know (`+trainer.foo=3`) would be ignored: refused. The groups are open."""
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
    """The config as plain values (what a weights_only checkpoint may hold), the groups as configured so that
    it composes again; what is written of a config anywhere: credentials redacted (common/redaction.py)."""
    log = dict(config.log) if isinstance(config.log, LogConfig) else config.log
    plain = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.structured(replace(config, log=log)), resolve=True))
    if isinstance(config.data, DataConfig):
        plain["data"] = config.data.node
    return redact(plain)


CONFIG_GROUPS = ("model", "data", "optim", "scheduler", "task")


def compose_for_checkpoint(saved: dict[str, Any], user_overrides: list[str], config_name: str = "eval") -> DictConfig:
    """The config of `config_name` (eval, predict, generate): the checkpoint's own settings (its groups whole),
    then what the user overrode."""
    from hydra import compose
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = {item.split("=", 1)[0].lstrip("+~") for item in user_overrides if "=" in item}
    # A dotted key into a group the checkpoint brings (data.val_size=5) goes to the checkpoint's group.
    parsed = OverridesParser.create().parse_overrides(list(user_overrides))
    into_saved = [
        item for item in parsed if not item.is_delete() and into_a_saved_group(item.key_or_group, given, saved)
    ]
    rest = [line for item, line in zip(parsed, user_overrides, strict=True) if item not in into_saved]
    composed = compose(config_name=config_name, overrides=rest)
    merged = composed.copy()
    # A checkpoint from before the scheduler group holds the schedule's keys in optim: not optim's any more.
    saved = {**saved, "optim": {key: value for key, value in saved.get("optim", {}).items()
                                if key not in ("scheduler", "warmup_epochs")}}  # fmt: skip
    for section, value in saved.items():
        if section in given or section not in composed or section in ("trust_checkpoint", "callbacks"):
            continue  # the user's own say; a command on a checkpoint runs no callbacks
        if section in CONFIG_GROUPS:
            merged[section] = value
        else:  # of a section's settings, those this project has (not those of a capability it was made without)
            if isinstance(value, dict) and isinstance(composed[section], DictConfig):
                value = {key: item for key, item in value.items() if key in composed[section]}
            merged = OmegaConf.merge(merged, {section: value})  # type: ignore[assignment]
    for key in given:  # a dotted override (trainer.eval_batches=...) keeps the user's value
        if "." in key and key.split(".", 1)[0] not in given and key.split(".", 1)[0] not in CONFIG_GROUPS:
            OmegaConf.update(merged, key, OmegaConf.select(composed, key), merge=False)
    for item in into_saved:
        key = item.key_or_group
        if OmegaConf.select(merged, key, default=MISSING_KEY) is MISSING_KEY and not item.is_add():
            # (++, from let_group_keys_through, is a plain `key=value` of the user's)
            group = key.split(".", 1)[0]
            raise ConfigError(
                f"{key}: the checkpoint's {group} has no such key: see its config.yaml, or add it with +{key}"
            )
        OmegaConf.update(merged, key, item.value(), merge=True, force_add=True)
        reach_the_data_set(merged, saved, key)
    return merged


MISSING_KEY = object()


def let_group_keys_through(argv: list[str]) -> None:
    """`data.val_size=5` as `++`, which Hydra composes though eval.yaml's default group may lack the key:
    compose_for_checkpoint applies it to the checkpoint's group (and refuses a key that group lacks)."""
    whole = {arg.split("=", 1)[0] for arg in argv[1:] if "=" in arg and "." not in arg.split("=", 1)[0]}
    for index, arg in enumerate(argv[1:], start=1):
        key = arg.split("=", 1)[0]
        group = key.split(".", 1)[0]
        if "=" in arg and "." in key and group in CONFIG_GROUPS and group not in whole and key[0] not in "+~-":
            argv[index] = f"++{arg}"


def into_a_saved_group(key: str, given: set[str], saved: dict[str, Any]) -> bool:
    group = key.split(".", 1)[0]
    return "." in key and group in CONFIG_GROUPS and group in saved and group not in given


LOADER_KEYS = ("batch_size", "num_workers", "augment", "on_device", "collate")  # what the loader reads of data.*


def reach_the_data_set(merged: DictConfig, saved: dict[str, Any], key: str) -> None:
    """`data.val_size=5` reaches the data set's own `val_size` too (the checkpoint holds `${data.val_size}`
    resolved), or it would change nothing; a data set without that key and value: refused, not ignored."""
    section, _, name = key.partition(".")
    if section != "data" or "." in name or name in LOADER_KEYS or "data" in saved and name not in saved["data"]:
        return
    dataset, before = merged.data.get("dataset", {}), saved.get("data", {}).get(name)
    if name in dataset and dataset[name] == before:
        dataset[name] = merged.data[name]
    elif before is not None:
        raise ConfigError(
            f"{key}: the checkpoint's data set does not take data.{name}: give its own key, "
            f"data.dataset.<key>=..., or leave it as trained"
        )

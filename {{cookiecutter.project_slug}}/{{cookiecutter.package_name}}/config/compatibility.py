"""Settings that must agree, as pure rules of the configs and a checkpoint's payload (no torch): a resumed run's
with its checkpoint's (what a resume refuses, accepts with `checkpoint.allow_changes`, or lists in the log; a
finished run relaunched with changes that would matter is refused) and every node's with every other's
(engine/assembly/compatibility.py checks them). The rules and why: docs/checkpoints.md, "What a resume may change".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..common.errors import ConfigError
from ..common.registry import modules_with

REFUSED = ("model", "optim._target_", "seed", "data")
# The same samples, batched otherwise or cached elsewhere (with the RESUMABLE_LOADER_KEYS of the capabilities'
# modules beside this one, found by what is present), and what their OPERATIONAL_KEYS change.
ADDED = tuple(module for module in modules_with(__package__, [str(Path(__file__).parent)], "SECTION_FIELDS")
              if hasattr(module, "check_section"))  # fmt: skip
ADDED_KEYS = tuple(key for added in ADDED for key in getattr(added, "RESUMABLE_LOADER_KEYS", ()))  # not this module
LOADER_KEYS = ("data.batch_size", "data.global_batch_size", "data.micro_batch_size", "data.num_workers",
               "data.on_device", *ADDED_KEYS)  # fmt: skip
# What a finished run may be relaunched with, changed, without anything being silently ignored. model.init_from
# and its trust_checkpoint: only a new run reads them, so a resume never refuses them.
STARTING_KEYS = ("model.init_from", "trust_checkpoint")
OPERATIONAL = ("log", "dist", "checkpoint", "trainer.log_every_n_steps", "trainer.record_samples", *LOADER_KEYS,
               *STARTING_KEYS, *(key for added in ADDED for key in getattr(added, "OPERATIONAL_KEYS", ())))  # fmt: skip
SHOWN = 4  # differences named in one line


def leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as {dotted key: value}; lists are values."""
    if not isinstance(node, dict):
        return {prefix: node}
    found: dict[str, Any] = {}
    for key, value in node.items():
        found.update(leaves(value, f"{prefix}{key}" if not prefix else f"{prefix}.{key}"))
    return found


def under(key: str, prefixes: tuple[str, ...] | list[str]) -> bool:
    return any(key == prefix or key.startswith(prefix + ".") for prefix in prefixes)


def differences(saved: dict[str, Any], config: dict[str, Any], resume: bool = True) -> dict[str, tuple[Any, Any]]:
    """{key: (checkpoint's value, config's)} for every setting that differs, less a data set argument that only
    repeats another key (`data.dataset.train_size: ${data.train_size}`, `seed: ${seed}`). A `resume` ignores
    where it resumes from, what it accepts, and a setting newer than the checkpoint that is off."""
    old, new = leaves(saved), leaves(config)
    changed = {key: (old.get(key), new.get(key)) for key in sorted({*old, *new}) if old.get(key) != new.get(key)}
    for key in list(changed) if resume else []:
        newer_off = key not in old and changed[key][1] in (None, 0, 0.0, False, "")
        if newer_off or key in ("checkpoint.resume", "checkpoint.allow_changes"):
            del changed[key]
    for key in list(changed):
        name = key.rsplit(".", 1)[-1]
        if key.startswith("data.dataset.") and changed[key] in (changed.get(f"data.{name}"), changed.get(name)):
            del changed[key]
    return changed


def listed(changed: dict[str, tuple[Any, Any]], keys: list[str]) -> str:
    shown = "; ".join(f"{key}: checkpoint {changed[key][0]!r}, config {changed[key][1]!r}" for key in keys[:SHOWN])
    return shown + (f"; and {len(keys) - SHOWN} more" if len(keys) > SHOWN else "")


def check_resumable(path: Path | str, payload: dict[str, Any], config: dict[str, Any], epochs: int) -> list[str]:
    """Refuse a resume that would break a promise (ConfigError, one line); else the changes it makes,
    one string each, for the log. `config` is the plain config the run continues with."""
    changed = differences(payload.get("config", {}), config)
    exempt = (*LOADER_KEYS, *STARTING_KEYS, *config.get("checkpoint", {}).get("allow_changes", []))
    refused = [key for key in changed if under(key, REFUSED) and not under(key, exempt)]
    model = [key for key in refused if under(key, ("model",))]
    if model:
        raise ConfigError(
            f"checkpoint {path} does not fit this model ({listed(changed, model)}): use the same model settings, "
            "another run dir, or checkpoint.resume=never"
        )
    if "optim._target_" in refused:
        old, new = changed["optim._target_"]
        raise ConfigError(
            f"checkpoint {path} holds the state of optim._target_={old}, not {new}: resume with the same optimizer, "
            "another run dir, or checkpoint.resume=never"
        )
    if refused:
        accept = ",".join(sorted({key.split(".")[0] for key in refused}) if len(refused) > SHOWN else refused)
        raise ConfigError(
            f"checkpoint {path} was trained with another sample order or data set ({listed(changed, refused)}): "
            "resuming would repeat or skip samples of its epoch. Launch with the checkpoint's values, give a new run "
            "dir (RUN_DIR, or RUN_NAME on many nodes) to start a new run, or accept it: "
            f"checkpoint.allow_changes=[{accept}]"
        )
    max_steps = config.get("trainer", {}).get("max_steps", 0)
    ignored = [key for key in changed if not under(key, OPERATIONAL)]
    if run_finished(payload, epochs, max_steps) and ignored:
        stopped = (payload.get("monitor") or {}).get("stopped")
        where = (f"stopped early: {stopped}" if stopped else f"step {payload.get('step')} of {max_steps}" if max_steps
                 else f"epoch {payload['epoch']} of {epochs}, step {payload.get('step')}")  # fmt: skip
        more = "a new run dir" if stopped else "more trainer.max_steps" if max_steps else "more trainer.epochs"
        raise ConfigError(
            f"the run of checkpoint {path} has finished ({where}) and would train nothing with the changed settings "
            f"({listed(changed, ignored)}): give a new run dir (RUN_DIR, or RUN_NAME on many nodes) to train with "
            f"them, or {more} to go on"
        )
    return [f"{key}: {old!r} -> {new!r}" for key, (old, new) in changed.items()]


def between_nodes(reference: dict[str, Any], other: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (reference node's value, other node's)} for every setting that differs: unlike a resume's
    (differences), nodes may differ in nothing, not even checkpoint.resume or checkpoint.allow_changes."""
    return differences(reference, other, resume=False)


def run_finished(payload: dict[str, Any], epochs: int, max_steps: int) -> bool:
    """Whether a run at this state (a checkpoint's payload, or the trainer's) has trained all it will: stopped
    early, at trainer.max_steps where set, else after its trainer.epochs whole epochs."""
    if (payload.get("monitor") or {}).get("stopped"):
        return True
    if max_steps:
        return payload.get("step", 0) >= max_steps
    return payload.get("epoch", 0) >= epochs and payload.get("samples_in_epoch", 0) == 0

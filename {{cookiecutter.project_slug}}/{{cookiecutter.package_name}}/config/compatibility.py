"""Settings that must agree: every rank's with every other's, and a resumed run's with its checkpoint's
(docs/checkpoints.md, "What a resume may change").

Every rank composes its config from its own node's command line. At start the ranks exchange one
hash of it; nodes launched with other overrides stop the whole job at once, in one line naming the
keys and the nodes, before any training (they would train different replicas, or wait forever):
engine/assembly/compatibility.py's check_same_config_everywhere, with between_nodes' rule.

A checkpoint continues under the config it is resumed with. Three kinds of change would break a
promise, and are refused in one line that names the keys and says how to go on:
- the model (`model.*`): the saved weights would not fit it, or not mean the same;
- the optimizer class (`optim._target_`): the saved optimizer state is another optimizer's;
- what an epoch holds and its order: the seed and the data set (`seed`, `data.*` but the loader's
  batch_size, global_batch_size, micro_batch_size, num_workers and on_device): mid-epoch, samples would be
  repeated or never seen. A resume counts the samples of the epoch done, not the steps, so it may batch them
  otherwise; and with data.global_batch_size set, the world size changes neither the steps nor their samples. Data
  prepared again under the same `data.root` (a prepared kind's files) is such a change too: a
  checkpoint records the data's id (engine/assembly/compatibility.py's SamePreparedData).
`checkpoint.allow_changes` lists the keys (or a prefix of them, `data`) a user accepts changing
anyway. Every other change (more epochs, the learning rate, precision, the strategy, logging) is
allowed and listed in the log, except where a saved state would bend its meaning (a torch scheduler
past the warm-up: engine/schedule.py; a changed monitor: engine/monitor.py). A run that has finished
trains nothing more: a relaunch of it with changes that would matter to training is refused too,
rather than silently ignored.

The rules alone live here, pure functions of the configs and a checkpoint's payload (no torch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..common.errors import ConfigError
from ..common.registry import modules_with

REFUSED = ("model", "optim._target_", "seed", "data")
# The same samples, batched otherwise, or cached elsewhere (the RESUMABLE_LOADER_KEYS of a capability's
# module of this package, found by what is present), and what such a module's OPERATIONAL_KEYS change.
ADDED = tuple(module for module in modules_with(__package__, [str(Path(__file__).parent)], "SECTION_FIELDS")
              if hasattr(module, "check_section"))  # fmt: skip
ADDED_KEYS = tuple(key for added in ADDED for key in getattr(added, "RESUMABLE_LOADER_KEYS", ()))  # not this module
LOADER_KEYS = ("data.batch_size", "data.global_batch_size", "data.micro_batch_size", "data.num_workers",
               "data.on_device", *ADDED_KEYS)  # fmt: skip
# What a finished run may be relaunched with, changed, without anything being silently ignored.
# model.init_from: only a new run reads it (init_weights.py), so a resume never refuses it; nor the trust
# it is read with (trust_checkpoint).
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


def differences(saved: dict[str, Any], config: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (checkpoint's value, config's)} for every setting that differs. A data set argument that
    only repeats another key (`data.dataset.train_size: ${data.train_size}`, `seed: ${seed}`) is named
    by that key alone."""
    old, new = leaves(saved), leaves(config)
    changed = {key: (old.get(key), new.get(key)) for key in sorted({*old, *new}) if old.get(key) != new.get(key)}
    changed.pop("checkpoint.resume", None)  # where it resumes from: the point of a resume
    for key in [key for key in changed if key not in old and changed[key][1] in (None, 0, 0.0, False, "")]:
        del changed[key]  # a setting newer than the checkpoint, off: it changes nothing
    changed.pop("checkpoint.allow_changes", None)
    return without_repeats(changed)


def without_repeats(changed: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """`changed` less the data set arguments that only repeat another changed key."""
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
    allowed = list(config.get("checkpoint", {}).get("allow_changes", []))
    refused = [key for key in changed if under(key, REFUSED) and not under(key, (*LOADER_KEYS, *STARTING_KEYS))]
    refused = [key for key in refused if not under(key, allowed)]
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
    """{key: (reference node's value, other node's)} for every setting that differs. Unlike a resume
    (differences), nodes may differ in nothing: what a resume accepts or where it resumes from
    (checkpoint.allow_changes, checkpoint.resume) would have one node resume, or accept a checkpoint,
    where another does not. A data set argument that only repeats another key is named by that key alone."""
    old, new = leaves(reference), leaves(other)
    changed = {key: (old.get(key), new.get(key)) for key in sorted({*old, *new}) if old.get(key) != new.get(key)}
    return without_repeats(changed)


def run_finished(payload: dict[str, Any], epochs: int, max_steps: int) -> bool:
    """Whether a run at this state (a checkpoint's payload, or the trainer's) has trained all it will:
    stopped early, at trainer.max_steps where set, else after its trainer.epochs whole epochs."""
    if (payload.get("monitor") or {}).get("stopped"):
        return True
    if max_steps:
        return payload.get("step", 0) >= max_steps
    return payload.get("epoch", 0) >= epochs and payload.get("samples_in_epoch", 0) == 0

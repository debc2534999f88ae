"""What receives a run's metrics beside metrics.jsonl: every module (or package) in this folder is a sink,
each on or off by the `log` config section; nothing outside names them.

A sink module has `build(log, run_dir, env)`, which returns the sink or None (switched off), and may
have `check(log)`, what a launch checks of it before anything starts. A sink has `start(resumed_step,
metrics_path, plain_config, own_checkpoint)` (rank 0, once the run has resumed), `write(kind, values)`
and `close()`, like metrics.jsonl; and may have `state_dict()`/`load_state_dict(payload)` (its part of
every checkpoint) and `commit(step)` (a checkpoint of `step` is on disk).
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType
from typing import Any


def sink_modules() -> list[ModuleType]:
    """The sinks this project has."""
    return [importlib.import_module(f".{info.name}", __name__) for info in pkgutil.iter_modules(__path__)]


def check_sinks(log: Any) -> None:
    """What a launch checks of the sinks switched on: one line (ConfigError) before any work."""
    for module in sink_modules():
        if hasattr(module, "check"):
            module.check(log)


def build_sinks(log: Any, run_dir: Path, env: Any) -> list[Any]:
    """The sinks the `log` section switches on (not started yet)."""
    return [sink for module in sink_modules() if (sink := module.build(log, run_dir, env)) is not None]

"""{{ cookiecutter.project_name }}: distributed training with torchrun, its strategies, and Hydra.

What your own model, data set or task may rely on (README.md, "Your own model and data"); the rest may
change: `Task` and `gather_with_grad` (tasks/), `seeded_by_sample`, `sample_generator`, `current_sample`
(datasets/randomness.py), `TensorImages` and `normalise` (datasets/images.py). They load on first use:
`import {{ cookiecutter.package_name }}` costs no torch import (the launcher's start-up).
"""

from __future__ import annotations

import importlib
from typing import Any

EXPORTS = {
    "Task": "tasks",
    "gather_with_grad": "tasks",
    "seeded_by_sample": "datasets.randomness",
    "sample_generator": "datasets.randomness",
    "current_sample": "datasets.randomness",
    "TensorImages": "datasets",
    "normalise": "datasets",
}
__all__ = sorted(EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{EXPORTS[name]}", __name__), name)

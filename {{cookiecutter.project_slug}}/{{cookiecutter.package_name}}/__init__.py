"""{{ cookiecutter.project_name }}: distributed training with torchrun, its strategies, and Hydra.

What your own model, data set or task may rely on, importable from the package itself
(README.md, "Your own model and data"); everything else is the template's inside and may change:

- `Task`: the interface of a `task._target_` (loss and metrics per sample, or (total, count) pairs), tasks/__init__.py.
- `gather_with_grad`: every rank's rows of a tensor, with their gradients (a contrastive loss's
  negatives over the global batch), tasks/__init__.py (docs/tasks.md).
- `seeded_by_sample`, `sample_generator`, `current_sample`: randomness drawn per sample, so that a
  resume repeats it bit for bit at any number of processes, datasets/randomness.py.
- `TensorImages`, `normalise`: an in-memory image data set, datasets/images.py.

They load on first use: `import {{ cookiecutter.package_name }}` costs no torch import (the launcher's
start-up).
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

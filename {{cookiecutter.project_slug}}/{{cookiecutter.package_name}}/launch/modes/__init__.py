"""The launch modes beyond single and multi: every module in this folder is one, present where it was chosen
when the project was made; nothing outside names them. A mode has MODE (`python -m <package>.launch MODE`),
SCRIPT (its script in scripts/), SHARED_KEYS (the launcher's keys it takes too), KEYS (its own Key's) and
`main(args, environ, forwarder) -> int`, which prints what starts a job elsewhere or starts torchrun itself."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from types import ModuleType


@functools.cache  # the folder does not change while a launch runs: read once
def extra_modes() -> dict[str, ModuleType]:
    """The modes this project has beyond the three of the launcher, by their word."""
    modules = [importlib.import_module(f".{info.name}", __name__) for info in pkgutil.iter_modules(__path__)]
    return {module.MODE: module for module in modules}

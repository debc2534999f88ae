"""The fixtures tests in any folder may use (a fixture one test file alone needs stays in that file); those of
a capability the project may be made without are in a module of their own beside this file, registered by
what is present (FIXTURES_MODULES)."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

# What the launch scripts give every worker (launch/plan.py), before this process's first matrix product:
# Intel MKL's products then have the same bits at any memory alignment, so the runs made here, in
# process and on forked ranks, are bit-exact on any x86 CPU as the jobs are (docs/checkpoints.md). Without
# it, a PowerSGD run resumed on two ranks differed from the uninterrupted one in the last bit on AMD CPUs.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import pytest
from hydra.core.global_hydra import GlobalHydra

from {{cookiecutter.package_name}} import eval as eval_entry
from {{cookiecutter.package_name}} import train as train_entry
from {{cookiecutter.package_name}}.common.run_dir import CONTROL_DIR_ENV

# The modules beside this file that declare `FIXTURES = (...)` (the names of the fixtures they define): each a
# capability's own, which a project made without it lacks, so none is named here.
FIXTURES_MODULES = sorted(
    f"{__package__}.{path.stem}"
    for path in Path(__file__).parent.glob("*.py")
    if re.search(r"^FIXTURES = ", path.read_text(), re.MULTILINE)
)
pytest_plugins = FIXTURES_MODULES


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real jobs (tests/e2e, seconds to a minute a test, much of it waiting on a process) first: under
    `-n 2 --dist loadfile` each worker takes the next file as it is free, so the many short in-process files
    fill the end, and the two workers finish together, not one of them alone on a job of a minute."""
    items.sort(key=lambda item: "e2e" not in item.path.parts)  # stable: each group keeps its order


@pytest.fixture
def fresh_logging() -> Iterator[None]:
    """setup_logging takes the root logger over (as each worker's does): give pytest's back after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)


@pytest.fixture
def in_process(monkeypatch, fresh_logging) -> Iterator[list[int]]:
    """Run train.py's or eval.py's main() here: its exit code recorded instead of the process ended;
    what it takes over for a worker's life (the root logger, sys.stdout, Hydra's global state,
    LOCAL_RANK) given back."""
    exits: list[int] = []
    for module in (train_entry, eval_entry):
        monkeypatch.setattr(module, "exit_now", exits.append)
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # setup_logging wraps them
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    monkeypatch.setenv("LOCAL_RANK", "unset")  # so that the undo removes what the entry sets
    monkeypatch.delenv("LOCAL_RANK")
    for name in ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", CONTROL_DIR_ENV):
        monkeypatch.delenv(name, raising=False)
    yield exits
    GlobalHydra.instance().clear()

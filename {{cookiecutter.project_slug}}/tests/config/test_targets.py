"""config/targets.py: every option of every config group names a callable its `_target_` reaches (the
`_target_`s that cannot work, refused as a worker starts: tests/engine/assembly/test_checks.py), and the
modules of a rank's targets imported before the group forms."""

from __future__ import annotations

import sys

import pytest

from {{cookiecutter.package_name}}.config import TrainConfig, to_train_config
from {{cookiecutter.package_name}}.config.targets import import_targets, target_of

from ..helpers import PROJECT_DIR, compose_config

OPTIONS = [
    f"{group.name}={path.stem}"
    for group in sorted((PROJECT_DIR / "configs").iterdir())
    if group.is_dir()
    for path in sorted(group.glob("*.yaml"))
]


TASKS = sorted((path.stem for path in (PROJECT_DIR / "configs" / "task").glob("*.yaml")),
               key=lambda name: name != "classification")  # fmt: skip


def composed_with_a_task(choice: str) -> TrainConfig:
    """The config of `choice` with the first of the project's tasks it goes with (an option made for one
    task, as a task's own model and data are, does not compose with another's)."""
    if choice.startswith("task="):
        return to_train_config(compose_config([choice]))
    failures = []
    for task in TASKS:
        try:
            return to_train_config(compose_config([f"task={task}", choice]))
        except Exception as error:  # Hydra's, omegaconf's, the schema's: the next task, and all said at the end
            failures.append(f"task={task}: {error}")
    raise AssertionError(f"{choice} composes with none of the tasks: {failures}")


@pytest.mark.parametrize("choice", OPTIONS)
def test_every_group_option_composes_checks_and_names_a_callable(choice: str) -> None:
    config = composed_with_a_task(choice)
    for key, node in [("model", config.model), ("optim", config.optim), ("task", config.task),
                      ("data.dataset", config.data.dataset)]:  # fmt: skip
        assert callable(target_of(node, key)), key


def test_a_rank_that_does_not_check_imports_the_targets_modules_and_leaves_failures_to_the_checks(
    tmp_path, monkeypatch
) -> None:
    (tmp_path / "startup_model.py").write_text("def build():\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "startup_model", raising=False)
    import_targets([{"_target_": "no_such_module.build"}, {"_target_": "startup_model.build"}, None, {}])
    assert "startup_model" in sys.modules  # imported before the group forms, not after

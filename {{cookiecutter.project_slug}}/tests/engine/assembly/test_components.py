"""engine/assembly/components.py: the task's builder offers the keys a task config offers (a task module's
OFFERED) only to a task that takes them (the `_target_`s every config group names: tests/config/test_targets.py);
the modules that record each start of a run are found by what is present."""

from __future__ import annotations

import importlib
import pkgutil

from {{cookiecutter.package_name}} import observe
from {{cookiecutter.package_name}}.engine.assembly import components
from {{cookiecutter.package_name}}.engine.assembly.components import build_task


class OwnTask:
    """A user's own task that takes no arguments, as tasks were before a task config offered a key."""

    def loss(self, outputs, targets):  # noqa: ANN001, ANN201
        return outputs

    def metrics(self, outputs, targets):  # noqa: ANN001, ANN201
        return {"loss": outputs}


class OwnTaskWithOptions(OwnTask):
    def __init__(self, **options) -> None:  # noqa: ANN003
        self.options = options


def test_an_offered_key_reaches_only_a_task_that_takes_it(monkeypatch) -> None:
    monkeypatch.setattr(components, "offered_keys", lambda: ("prepared_folder",))
    assert isinstance(build_task({"_target_": f"{__name__}.OwnTask", "prepared_folder": "x"}), OwnTask)
    taken = build_task({"_target_": f"{__name__}.OwnTaskWithOptions", "prepared_folder": "x"})
    assert taken.options == {"prepared_folder": "x"}  # **options takes it
    monkeypatch.setattr(components, "offered_keys", tuple)  # nothing offered: the node as configured
    assert build_task({"_target_": f"{__name__}.OwnTaskWithOptions", "other": 1}).options == {"other": 1}


def test_the_run_records_are_the_modules_of_observe_that_define_one() -> None:
    names = [f"{observe.__name__}.{info.name}" for info in pkgutil.iter_modules(observe.__path__)]
    defining = [name for name in names if hasattr(importlib.import_module(name), "RUN_RECORD")]
    assert [module.__name__ for module in components.run_records()] == defining
    for module in components.run_records():
        assert callable(module.RUN_RECORD.start) and callable(module.describe) and callable(module.write_export_record)

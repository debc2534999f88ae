"""engine/assembly/components.py: the task's builder offers task=language_model's keys only to a task that takes
them (the `_target_`s every config group names: tests/config/test_targets.py)."""

from __future__ import annotations

from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly.components import build_task
from {{cookiecutter.package_name}}.tasks import LanguageModel

from ...helpers import compose_config


class OwnTask:
    """A user's own task that takes no arguments, as tasks were before task=language_model offered vocab_from."""

    def loss(self, outputs, targets):  # noqa: ANN001, ANN201
        return outputs

    def metrics(self, outputs, targets):  # noqa: ANN001, ANN201
        return {"loss": outputs}


class OwnTaskWithOptions(OwnTask):
    def __init__(self, **options) -> None:  # noqa: ANN003
        self.options = options


def test_task_language_models_vocab_from_reaches_only_a_task_that_takes_it() -> None:
    for task, built in ((f"{__name__}.OwnTask", OwnTask), ("{{cookiecutter.package_name}}.tasks.LanguageModel", LanguageModel)):
        config = to_train_config(compose_config(["task=language_model", f"task._target_={task}"]))
        assert "vocab_from" in config.task and isinstance(build_task(config.task), built)
    config = to_train_config(compose_config(["task=language_model", f"task._target_={__name__}.OwnTaskWithOptions"]))
    assert build_task(config.task).options == {"vocab_from": None}  # **options takes it

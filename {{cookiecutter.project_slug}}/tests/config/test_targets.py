"""config/targets.py: every option of every config group names a callable its `_target_` reaches (the
`_target_`s that cannot work, refused as a worker starts: tests/engine/assembly/test_checks.py), and the
modules of a rank's targets imported before the group forms."""

from __future__ import annotations

import sys

import pytest

from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.config.targets import import_targets, target_of

from ..helpers import PROJECT_DIR, compose_config

OPTIONS = [
    f"{group.name}={path.stem}"
    for group in sorted((PROJECT_DIR / "configs").iterdir())
    if group.is_dir()
    for path in sorted(group.glob("*.yaml"))
]


@pytest.mark.parametrize("choice", OPTIONS)
def test_every_group_option_composes_checks_and_names_a_callable(choice: str) -> None:
    in_language_model = choice in ("model=gpt", "data=text", "data=tokens")  # they belong with task=language_model
    language = ["task=language_model"] if in_language_model else []
    config = to_train_config(compose_config([*language, choice]))
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

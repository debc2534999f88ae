"""config/__init__.py: the names of the package's optional modules (their `__all__`) stay importable as
`<package>.config.<Name>`, where the project has them; a name no module has is an AttributeError."""

from __future__ import annotations

import pytest

from {{cookiecutter.package_name}} import config
from {{cookiecutter.package_name}}.config.strategies import STRATEGY_MODULES


def test_an_optional_modules_names_are_the_packages_and_an_unknown_name_is_refused() -> None:
    for module in STRATEGY_MODULES:
        for name in getattr(module, "__all__", ()):
            assert getattr(config, name) is getattr(module, name)
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchConfig'"):
        config.NoSuchConfig  # noqa: B018

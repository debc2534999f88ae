"""common/registry.py: a package's members found by what is present, in a package written by the test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.common.registry import buildable_beside, defined_beside


def test_the_modules_beside_give_their_buildable_in_name_order_and_a_missing_name_is_an_attribute_error(
    tmp_path: Path, monkeypatch
) -> None:
    package = tmp_path / "kit"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "b_part.py").write_text("class Second:\n    pass\n\n\nBUILDABLE = (Second,)\n")
    (package / "a_part.py").write_text("class First:\n    pass\n\n\nBUILDABLE = (First,)\n")
    (package / "c_none.py").write_text("class Unlisted:\n    pass\n")  # no BUILDABLE: contributes nothing
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        found = buildable_beside("kit", [str(package)])
        assert [item.__name__ for item in found] == ["First", "Second"]
        assert defined_beside("kit", [str(package)], "Second") is found[1]
        with pytest.raises(AttributeError, match="module 'kit' has no attribute 'Unlisted'"):
            defined_beside("kit", [str(package)], "Unlisted")  # in a module that registers nothing: not a member
        assert buildable_beside("kit", [str(tmp_path / "empty")]) == ()
        assert "kit.c_none" not in sys.modules, "a module that registers nothing is not imported for it"
    finally:
        for name in [name for name in sys.modules if name == "kit" or name.startswith("kit.")]:
            del sys.modules[name]

"""Two groups for pytest-xdist's two processes (pyproject.toml), of about equal time: the defaults bake's
whole suite and the README's first command; the smallest bake's whole suite and everything else. Each
suite runs two test processes of its own. The slow tests of a group go first, so that they share the
cores with the other group's suite rather than run after it alone."""

from __future__ import annotations

import pytest

BESIDE_THE_DEFAULTS = ("test_generated_project_passes_its_linter_and_its_own_tests",
                       "test_readme_first_command_bakes_the_demo_and_trains_it_to_what_the_readme_says")  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group("defaults" if item.name in BESIDE_THE_DEFAULTS else "the_rest"))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: the slow ones first

"""Two groups for pytest-xdist's two processes (pyproject.toml): the generated project's whole suite,
which takes most of the time and runs two test processes of its own, and everything else beside it.
The rest's slow tests (another bake's fast tests, the README's first command) go first, so that they
share the cores with the whole suite rather than run after it alone (they had, for its last minutes)."""

from __future__ import annotations

import pytest

WHOLE_SUITE = "test_generated_project_passes_its_linter_and_its_own_tests"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group("whole_suite" if item.name == WHOLE_SUITE else "the_rest"))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: the slow ones first

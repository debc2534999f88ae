"""engine/entry.py, what a worker fixes up before training: the legacy launcher's argument (the checks it
runs as it starts: tests/engine/test_checks.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from {{cookiecutter.package_name}}.engine.entry import accept_legacy_local_rank


@pytest.fixture(autouse=True)
def environ_restored() -> Iterator[None]:
    """accept_legacy_local_rank sets LOCAL_RANK in os.environ itself: the tests after these get theirs back."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize(
    "argv",
    [
        ["train.py", "--local-rank=1", "trainer.epochs=2"],
        ["train.py", "--local_rank=1", "trainer.epochs=2"],
        ["train.py", "--local-rank", "1", "trainer.epochs=2"],
    ],
)
def test_legacy_local_rank_argument_is_accepted(argv, monkeypatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    accept_legacy_local_rank(argv)
    assert argv == ["train.py", "trainer.epochs=2"]
    assert os.environ["LOCAL_RANK"] == "1"

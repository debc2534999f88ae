"""What the checkpoint tests share: a store of this process's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.common.storage import filesystem


@pytest.fixture
def memory_url(tmp_path: Path) -> Iterator[str]:
    """A store in this process's memory, this test's own (fsspec's memory:// is one per process)."""
    url = f"memory://{tmp_path.name}/run"
    yield url
    fs, root = filesystem(url)
    if fs.exists(root):
        fs.rm(root, recursive=True)

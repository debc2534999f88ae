"""The object stores of the tests, fixtures any test file may use (tests/conftest.py registers this module,
FIXTURES below): a real S3 API over HTTP on 127.0.0.1, moto's server (`moto_server -p0`, the server s3fs's
own tests run against), started by the test that needs it, with credentials that are a secret string no
file of a run may hold (tests grep the run dir for it); and a store in this process's memory."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.common.object_store import filesystem

FIXTURES = ("s3_server", "memory_url")  # what tests/conftest.py registers this module for


@dataclass
class S3Server:
    process: subprocess.Popen[str]
    endpoint: str  # http://127.0.0.1:<port>
    secret: str = field(default_factory=lambda: f"s3-secret-{uuid.uuid4().hex}")

    def env(self) -> dict[str, str]:
        """What a job's environment gives the S3 client (botocore reads AWS_ENDPOINT_URL): the same
        variables a user sets for AWS or any S3-compatible store."""
        return {"AWS_ACCESS_KEY_ID": "test-key-id", "AWS_SECRET_ACCESS_KEY": self.secret,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip

    def filesystem(self):  # noqa: ANN201 (an s3fs.S3FileSystem)
        import s3fs

        return s3fs.S3FileSystem(key="test-key-id", secret=self.secret, client_kwargs={"endpoint_url": self.endpoint},
                                 skip_instance_cache=True)  # fmt: skip

    def bucket(self, name: str | None = None) -> str:
        """A new empty bucket: its s3:// URL."""
        name = name or f"bucket-{uuid.uuid4().hex[:8]}"
        self.filesystem().mkdir(name)
        return f"s3://{name}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


def start_s3_server(timeout: float = 30) -> S3Server:
    """moto's server on a free port of 127.0.0.1 (it says which on its first lines)."""
    command = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or "moto_server"
    process = subprocess.Popen([command, "-H", "127.0.0.1", "-p0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if match := re.search(r"Running on (http://127\.0\.0\.1:\d+)", line):
            # It logs every request: read them away, or a full pipe would stop the server mid-test.
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return S3Server(process, match.group(1))
        if not line and process.poll() is not None:
            break
    process.kill()
    pytest.fail("moto_server did not start: pip install 'moto[server]'")


@pytest.fixture
def s3_server(monkeypatch) -> Iterator[S3Server]:
    """moto's server, its credentials in this process's environment as a user's would be; stopped after
    the test."""
    server = start_s3_server()
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def memory_url(tmp_path: Path) -> Iterator[str]:
    """A store in this process's memory, this test's own (fsspec's memory:// is one per process)."""
    url = f"memory://{tmp_path.name}/run"
    yield url
    fs, root = filesystem(url)
    if fs.exists(root):
        fs.rm(root, recursive=True)

"""Where files may live besides the local disk: an fsspec URL (`s3://bucket/prefix`, or any protocol
fsspec has a package for), for checkpoints (engine/checkpoint/) and data shards (datasets/shards.py).
Credentials come from the client's own environment variables and files (AWS_ACCESS_KEY_ID, ~/.aws/,
AWS_ENDPOINT_URL for an S3-compatible store): nothing here takes, keeps or writes one. Shared by the
launcher (is the store reachable, before torchrun) and the workers; no torch."""

from __future__ import annotations

from typing import Any

from .errors import ConfigError, first_line
from .redaction import redact_text

PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}


def is_remote(url: str) -> bool:
    """Whether `url` names an object store (or any fsspec protocol) rather than a local path."""
    return "://" in url and not url.startswith("file://")


def local_path(given: str, key: str) -> str:
    """A checkpoint or weights file this command reads from the local disk: an object store's URL is refused
    in one line (as a path it would be mangled, `s3:/bucket/...`, and said not to exist)."""
    if is_remote(given):
        raise ConfigError(
            f"{key}={redact_text(given)}: a checkpoint is read from this machine's disk, not from a store: copy it "
            "down first (for s3, `aws s3 cp --recursive <url> <folder>`; a run with checkpoint.dir=<prefix> resumes "
            "from the store by itself) and give the local path"
        )
    return given


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec file system of `url` and the path inside it; one line where its package is missing."""
    import fsspec

    protocol = url.split("://", 1)[0]
    try:
        return fsspec.core.url_to_fs(url, skip_instance_cache=True)  # the environment as it is now
    except ImportError:
        package = PACKAGES.get(protocol, f"the fsspec package for {protocol}://")
        raise ConfigError(
            f"{redact_text(url)} needs {package}: pip install {package} (or pip install -e '.[s3]')"
        ) from None


def check_reachable(url: str, key: str) -> None:
    """One line, before any work, where the store of `url` cannot be listed (unreachable, no such
    bucket, no permission): `key` is the setting that named it."""
    fs, path = filesystem(url)
    bucket = path.split("/", 1)[0]
    try:
        fs.ls(bucket, refresh=True)
    except Exception as error:  # botocore's, aiohttp's, PermissionError, FileNotFoundError: all say why
        raise ConfigError(
            f"{key}={redact_text(url)}: the store does not answer ({redact_text(first_line(error))}); check the "
            "address (AWS_ENDPOINT_URL), the bucket and the credentials"
        ) from None

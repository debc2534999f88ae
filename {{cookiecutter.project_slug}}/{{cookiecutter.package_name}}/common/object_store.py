"""Object stores: an fsspec URL (`s3://bucket/prefix`, or any protocol fsspec has a package for), for
checkpoints (engine/checkpoint/store.py) and data shards (datasets/shards.py); common/storage.py finds
this module by its STORE_PACKAGES. Credentials come from the client's own environment variables and
files (AWS_ACCESS_KEY_ID, ~/.aws/, AWS_ENDPOINT_URL for an S3-compatible store): nothing here takes, keeps
or writes one, and a URL that carries one (`s3://KEY:SECRET@bucket`, which s3fs would misread as a bucket)
is refused in one line. Shared by the launcher (is the store reachable, before torchrun) and the workers;
no torch."""

from __future__ import annotations

import logging
import re
from typing import Any

from .errors import ConfigError, first_line
from .redaction import redact_text

STORE_PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}
_USER_INFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@]*@")  # scheme://user[:password]@...
# How a checkpoint in a store is brought to this machine's disk, for a command that reads one there (storage.py).
COPY_DOWN = (" (for s3, `aws s3 cp --recursive <url> <folder>`; a run with checkpoint.dir=<prefix> resumes from the "
             "store by itself)")  # fmt: skip
for _chatty in ("botocore", "aiobotocore", "s3fs"):  # a store's client: "found credentials in ..." at INFO
    logging.getLogger(_chatty).setLevel(logging.WARNING)


def check_no_credentials(url: str, key: str) -> None:
    """One line for a URL that carries credentials (`s3://KEY:SECRET@bucket/prefix`): fsspec's clients do
    not take them from there (s3fs reads `KEY:SECRET@bucket` as the bucket's name), and a secret on a
    command line ends up in shell histories and process lists. `key`: the setting that named it."""
    if _USER_INFO.match(url):
        scheme, rest = url.split("://", 1)
        raise ConfigError(
            f"{key}={scheme}://***@{rest.split('@', 1)[1]}: credentials in the URL are not used: remove "
            f"'...@' and give them as the client reads them: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or AWS_PROFILE, ~/.aws/credentials, an instance role) for s3://"
        )


# A client that tries each request once: botocore retries a refused connection for about 12 s by
# itself, which a caller that retries within its own bound (checkpoint.store_retry_s) would overrun.
SINGLE_ATTEMPT = {"s3": {"config_kwargs": {"retries": {"total_max_attempts": 1}}}}


def filesystem(url: str, key: str = "url", single_attempt: bool = False) -> tuple[Any, str]:
    """The fsspec file system of `url` and the path inside it; one line where its package is missing
    or the URL carries credentials (`key`: the setting that named it). `single_attempt`: the client
    does not retry (SINGLE_ATTEMPT), for a caller that retries by itself."""
    import fsspec

    check_no_credentials(url, key)
    protocol = url.split("://", 1)[0]
    options = SINGLE_ATTEMPT.get(protocol, {}) if single_attempt else {}
    try:
        return fsspec.core.url_to_fs(url, skip_instance_cache=True, **options)  # the environment as it is now
    except ImportError:
        package = STORE_PACKAGES.get(protocol, f"the fsspec package for {protocol}://")
        raise ConfigError(
            f"{redact_text(url)} needs {package}: pip install {package} (or pip install -e '.[s3]')"
        ) from None


def check_reachable(url: str, key: str) -> None:
    """One line, before any work, where the store of `url` cannot be listed (unreachable, no such
    bucket, no permission): `key` is the setting that named it."""
    fs, path = filesystem(url, key)
    bucket = path.split("/", 1)[0]
    try:
        fs.ls(bucket, refresh=True)
    except Exception as error:  # botocore's, aiohttp's, PermissionError, FileNotFoundError: all say why
        raise ConfigError(
            f"{key}={redact_text(url)}: the store does not answer ({redact_text(first_line(error))}); check the "
            "address (AWS_ENDPOINT_URL), the bucket and the credentials"
        ) from None

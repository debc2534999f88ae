"""common/storage.py: which settings name an object store, its client found or asked for in one line, and
a store that does not answer said before any work, never with its credentials."""

from __future__ import annotations

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.common.storage import check_reachable, filesystem, is_remote


def test_urls_are_remote_and_paths_are_not() -> None:
    assert is_remote("s3://bucket/prefix") and is_remote("gs://b/p")
    assert not any(map(is_remote, ["", "outputs/run/checkpoints", "/abs/path", "file:///tmp/x"]))


def test_a_missing_client_package_is_one_line_saying_what_to_install() -> None:
    with pytest.raises(ConfigError, match=r"^gs://bucket/x needs gcsfs: pip install gcsfs") as raised:
        filesystem("gs://bucket/x")
    assert "\n" not in str(raised.value)


def test_a_store_that_does_not_answer_is_one_line_without_the_secret(monkeypatch) -> None:
    for name, value in {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "id",
                        "AWS_SECRET_ACCESS_KEY": "hush-hush", "AWS_MAX_ATTEMPTS": "1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as raised:
        check_reachable("s3://bucket/run", "checkpoint.dir")
    message = str(raised.value)
    assert message.startswith("checkpoint.dir=s3://bucket/run: the store does not answer (")
    assert "hush-hush" not in message and "\n" not in message


@pytest.mark.parametrize("url", ["s3://KEY:SECRET@bucket/run", "s3://KEY@bucket/run", "gs://KEY:SECRET@bucket/run"])
def test_credentials_in_the_url_are_refused_in_one_line_saying_how_to_give_them(url: str) -> None:
    scheme = url.split("://")[0]
    expected = (
        f"checkpoint.dir={scheme}://***@bucket/run: credentials in the URL are not used: remove '...@' and give "
        "them as the client reads them: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, "
        "~/.aws/credentials, an instance role) for s3://"
    )
    with pytest.raises(ConfigError) as raised:  # what the launcher asks before torchrun: nothing has started
        check_reachable(url, "checkpoint.dir")
    assert str(raised.value) == expected
    with pytest.raises(ConfigError, match=r"^url=s3://\*\*\*@b/x: credentials in the URL"):  # the workers' way in
        filesystem("s3://KEY:SECRET@b/x")

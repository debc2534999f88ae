"""common/object_store.py: the module common/storage.py finds for a URL, where the project has object stores;
a store's client found or asked for in one line, and a store that does not answer said before any work,
never with its credentials."""

from __future__ import annotations

import importlib
import logging

import pytest

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.common.object_store import COPY_DOWN, check_reachable, filesystem
from {{cookiecutter.package_name}}.common.storage import local_path, store_module, stores


def test_a_url_is_reached_through_this_module_and_a_checkpoint_url_is_said_how_to_copy_down() -> None:
    module = importlib.import_module("{{cookiecutter.package_name}}.common.object_store")
    assert stores() is module and store_module("s3://bucket/run", "checkpoint.dir") is module
    with pytest.raises(ConfigError) as refused:
        local_path("s3://bucket/run/step_00000004.pt", "ckpt_path")
    assert str(refused.value) == (
        "ckpt_path=s3://bucket/run/step_00000004.pt: a checkpoint is read from this machine's disk, not from a URL: "
        f"copy it down first{COPY_DOWN} and give the local path"
    )
    assert "aws s3 cp --recursive" in COPY_DOWN


def test_the_store_clients_say_only_warnings_and_worse() -> None:
    """botocore's "Found credentials in environment variables." and the like stay out of every rank's log: the
    clients are quieted where they are reached (this module), whatever logs.py sets up."""
    for name in ("botocore", "aiobotocore", "s3fs"):
        assert logging.getLogger(name).level == logging.WARNING, name  # its own, not the root's


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

"""redaction.py: credentials never reach what is written of the config, nor a log line."""

from __future__ import annotations

import logging
import sys

from {{cookiecutter.package_name}}.logs import RedactingFormatter, RedactingStream
from {{cookiecutter.package_name}}.redaction import redact, redact_text


def test_passwords_in_uris_are_hidden_and_the_rest_kept() -> None:
    assert redact_text("http://user:pa55@host:5000/x") == "http://user:***@host:5000/x"
    assert redact_text("s3://AKIA:wJ/x+y@bucket/pre and https://h/p") == "s3://AKIA:***@bucket/pre and https://h/p"
    plain = "http://host:5000/path, user:pw without a scheme"
    assert redact_text(plain) == plain


def test_a_config_keeps_its_shape_with_every_secret_hidden() -> None:
    config = {"log": {"tracking_uri": "http://u:p@h", "tracker_api_key": "k" * 40, "token": ""},
              "data": {"roots": ["s3://a:b@c", "local"]}, "seed": 3}  # fmt: skip
    assert redact(config) == {"log": {"tracking_uri": "http://u:***@h", "tracker_api_key": "***", "token": ""},
                              "data": {"roots": ["s3://a:***@c", "local"]}, "seed": 3}  # fmt: skip


def test_log_lines_and_their_tracebacks_are_redacted() -> None:
    formatter = RedactingFormatter("%(message)s")
    try:
        raise ConnectionError("cannot reach http://u:secret@h:1/api")
    except ConnectionError as error:
        record = logging.LogRecord("x", logging.WARNING, __file__, 1, "tracker %s: %s", ("http://u:secret@h", "down"),
                                   (type(error), error, error.__traceback__))  # fmt: skip
    text = formatter.format(record)
    assert "secret" not in text and "tracker http://u:***@h: down" in text and "http://u:***@h:1/api" in text


def test_what_a_library_prints_itself_is_redacted_too(capsys) -> None:
    stream = RedactingStream(sys.stdout)
    stream.write("View run at: http://tester:pw@127.0.0.1:5000/#/runs/1\n")
    stream.flush()
    assert capsys.readouterr().out == "View run at: http://tester:***@127.0.0.1:5000/#/runs/1\n"
    assert stream.isatty() is sys.stdout.isatty() and stream.encoding == sys.stdout.encoding


def test_the_config_a_checkpoint_and_the_trackers_get_holds_no_password() -> None:
    from {{cookiecutter.package_name}}.config import to_plain_dict, to_train_config

    from .helpers import compose_config

    config = to_train_config(compose_config(["data=cifar10", "data.root=s3://key:hush@bucket/cifar"]))
    assert to_plain_dict(config)["data"]["root"] == "s3://key:***@bucket/cifar"
    assert config.data.node["root"] == "s3://key:hush@bucket/cifar", "the job itself uses the real value"

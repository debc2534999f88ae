"""common/redaction.py: credentials hidden in a text and in a config of any shape (the log lines and the
console: tests/observe/test_logs.py; what is written of the config: tests/config/test_compose.py)."""

from __future__ import annotations

from {{cookiecutter.package_name}}.common.redaction import redact, redact_text


def test_passwords_in_uris_are_hidden_and_the_rest_kept() -> None:
    assert redact_text("http://user:pa55@host:5000/x") == "http://user:***@host:5000/x"
    assert redact_text("ftp://AKIA:wJ/x+y@host/pre and https://h/p") == "ftp://AKIA:***@host/pre and https://h/p"
    plain = "http://host:5000/path, user:pw without a scheme"
    assert redact_text(plain) == plain


def test_a_config_keeps_its_shape_with_every_secret_hidden() -> None:
    config = {"log": {"tracking_uri": "http://u:p@h", "tracker_api_key": "k" * 40, "token": ""},
              "data": {"roots": ["https://a:b@c", "local"]}, "seed": 3}  # fmt: skip
    assert redact(config) == {"log": {"tracking_uri": "http://u:***@h", "tracker_api_key": "***", "token": ""},
                              "data": {"roots": ["https://a:***@c", "local"]}, "seed": 3}  # fmt: skip

"""Credentials never reach a file, a log line or a tracker: a password in a URI (`http://user:secret@host`)
becomes `***` in what is written down, and so does the whole value of a key whose name says it holds a
secret (password, token, secret, api_key, credentials). The job itself still uses the real values."""

from __future__ import annotations

import re
from typing import Any

HIDDEN = "***"
# scheme://user:password@ -> scheme://user:***@ (the user name stays: it says whose access it is)
_URI_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)(?P<password>[^\s@]+)(?=@)")
_SECRET_KEY = re.compile(r"(password|passwd|secret|token|api_?key|credential)", re.IGNORECASE)


def redact_text(text: str) -> str:
    """`text` with every password in a URI replaced by ***."""
    return _URI_PASSWORD.sub(lambda match: match.group("head") + HIDDEN, text)


def redact(value: Any, key: str = "") -> Any:
    """A copy of a (nested) config value with its secrets hidden: passwords in URIs anywhere, and
    the whole value of keys named for a secret."""
    if isinstance(value, dict):
        return {name: redact(item, str(name)) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact(item, key) for item in value)
    if isinstance(value, str):
        return HIDDEN if value and _SECRET_KEY.search(key) else redact_text(value)
    return value

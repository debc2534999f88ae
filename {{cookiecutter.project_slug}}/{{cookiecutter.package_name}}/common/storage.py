"""Where a command's files are: this machine's disks. A URL (`scheme://...`) is no path here: a command that
reads a checkpoint from the disk refuses one in one line, and checkpoint.dir may name a store of files
elsewhere, reached through `store_module` where the project has one."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from .errors import ConfigError
from .redaction import redact_text
from .registry import modules_with


def stores() -> ModuleType | None:
    """The module that reaches stores of files elsewhere (its STORE_PACKAGES), where this project has one."""
    found = modules_with(__package__, [str(Path(__file__).parent)], "STORE_PACKAGES")
    return next((module for module in found if hasattr(module, "STORE_PACKAGES")), None)  # not this one


def is_remote(url: str) -> bool:
    """Whether `url` names a place other than this machine's disk (a URL other than file://)."""
    return "://" in url and not url.startswith("file://")


def local_path(given: str, key: str) -> str:
    """A checkpoint or weights file this command reads from the local disk: a URL is refused in one line
    (as a path it would be mangled, `scheme:/...`, and said not to exist)."""
    if is_remote(given):
        how = module.COPY_DOWN if (module := stores()) is not None else ""
        raise ConfigError(
            f"{key}={redact_text(given)}: a checkpoint is read from this machine's disk, not from a URL: copy it "
            f"down first{how} and give the local path"
        )
    return given


def store_module(url: str, key: str) -> ModuleType:
    """The module that reaches the store `url` names (`key`: the setting that named it); one line where this
    project keeps its files on its own disks only."""
    module = stores()
    if module is None:
        raise ConfigError(
            f"{key}={redact_text(url)}: a URL, and this project keeps its files on this machine's disks: give a folder"
        )
    return module

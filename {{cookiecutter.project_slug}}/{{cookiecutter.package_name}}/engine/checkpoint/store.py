"""Checkpoints in an object store (`checkpoint.dir=s3://bucket/prefix`, or any fsspec URL): the
local checkpoint folder is written as always, then each checkpoint goes up, and a resume on any
node, with an empty local disk, finds the newest whole one there and brings it down.

- Whole or absent: a `step_<N>.pt` is one object, and an object store shows an object only once its
  upload has completed. A folder of shards is whole once its `trainer.pt` is there, which
  goes up last; a folder without it (an upload cut by a kill) is never resumed, and is removed
  with the checkpoints `keep_last` prunes.
- A store that fails is retried with back-off for `checkpoint.store_retry_s` (here only: the client
  tries each request once, common/object_store.py's SINGLE_ATTEMPT); then the job stops
  with one line (JobError) naming the newest checkpoint the store lists then (listed once more to
  say it: a store that came back empty holds none), and the local copies, which stay.
- The store and the local folder are one history: a resume takes the newest whole checkpoint of
  either (writer.py).
- Credentials come from the client's own environment and files (common/object_store.py): nothing here sees one,
  and the URL is redacted wherever it is printed.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

from ...common.errors import JobError, first_line
from ...common.object_store import filesystem
from ...common.redaction import redact_text
from ...config import CheckpointConfig
from .files import NAME_PATTERN, TMP_PREFIX, TRAINER_FILE

log = logging.getLogger(__name__)
T = TypeVar("T")
FIRST_WAIT_S = 0.5  # the first retry's wait; each one after waits twice as long, up to MAX_WAIT_S
MAX_WAIT_S = 15.0


class CheckpointStore:
    """A checkpoint folder in an object store, mirrored from a local one."""

    def __init__(self, url: str, retry_s: float, local: Path | None = None) -> None:
        self.url = url.rstrip("/")
        self.shown = redact_text(self.url)
        self.retry_s = retry_s
        self.local = local  # the local copies, named in the stop line
        self.fs, self.root = filesystem(self.url, "checkpoint.dir", single_attempt=True)  # the retries: retrying()
        self.last_uploaded: str | None = None

    @classmethod
    def for_config(cls, config: CheckpointConfig, local: Path) -> CheckpointStore:
        """The store of `checkpoint.dir`, retried for `checkpoint.store_retry_s` (config/object_storage.py)."""
        return cls(config.dir, config.store_retry_s, local)  # type: ignore[attr-defined]

    def retrying(self, what: str, action: Callable[[], T]) -> T:
        """`action`, retried with back-off while the store fails, for `retry_s` at most."""
        deadline, wait = time.monotonic() + self.retry_s, FIRST_WAIT_S
        while True:
            try:
                return action()
            except Exception as error:  # botocore's, aiohttp's, OSError: the store's answer, whatever it is
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise JobError(
                        f"checkpoint.dir={self.shown}: {what} failed for {self.retry_s:.0f} s "
                        f"({redact_text(first_line(error))}); {self.what_is_there()}; fix the store (address, "
                        "credentials, space), then launch again to resume from the newest of the store and the "
                        "local copies"
                    ) from None
                log.warning("checkpoint store: %s failed (%s); retrying in %.1f s", what, first_line(error), wait)
                self.fs.invalidate_cache()
                time.sleep(min(wait, remaining))
                wait = min(2 * wait, MAX_WAIT_S)

    def what_is_there(self) -> str:
        """For the stop line: the newest checkpoint the store lists now (one listing, not retried: what was
        uploaded may be gone, as from a store that came back empty), and where the local copies are."""
        local = f"; the local copies in {self.local} stay" if self.local is not None else ""
        try:
            newest = self.listing()[:1]
        except Exception:  # the store still fails: what it holds cannot be said
            uploaded = f" (the last one uploaded: {self.shown}/{self.last_uploaded})" if self.last_uploaded else ""
            return f"the store could not be listed to say which checkpoint it holds{uploaded}{local}"
        there = f"the newest checkpoint there: {self.shown}/{newest[0]}" if newest else "the store holds no checkpoint"
        return there + local

    def listing(self) -> list[str]:
        """The whole checkpoints in the store, newest (highest step) first; the store's error as it is."""
        self.fs.invalidate_cache()
        if not self.fs.exists(self.root):
            return []
        found = []
        for entry in self.fs.ls(self.root, detail=True, refresh=True):
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            if match := NAME_PATTERN.match(name):
                whole = entry["type"] == "file" or self.fs.exists(f"{self.root}/{name}/{TRAINER_FILE}")
                if whole:
                    found.append((int(match.group(1)), name))
        return [name for _, name in sorted(found, reverse=True)]

    def names(self) -> list[str]:
        """The whole checkpoints in the store, newest (highest step) first."""
        return self.retrying("listing the checkpoints", self.listing)

    def say_which(self, name: str, in_store: bool, local: list[Path], stored: list[str], folder: Path) -> None:
        """The log line that says which of the store's and the local checkpoints a resume takes, and why."""
        if in_store:
            log.info("resuming from the store's %s/%s, brought down: the newest of the store and the local "
                     "checkpoints (the local newest: %s)", self.shown, name, local[0] if local else "none")  # fmt: skip
        else:
            log.info("resuming from the local %s: the newest of the local checkpoints and the store (the store's "
                     "newest: %s)", folder / name, f"{self.shown}/{stored[0]}" if stored else "none")  # fmt: skip

    def read_text(self, name: str) -> str | None:
        """A small object of the prefix (the owner marker) as text; None where there is none."""

        def read() -> str | None:
            try:
                return self.fs.cat_file(f"{self.root}/{name}").decode()
            except FileNotFoundError:
                return None

        return self.retrying(f"reading {name}", read)

    def write_text(self, name: str, text: str) -> None:
        self.retrying(f"saving {name}", lambda: self.fs.pipe_file(f"{self.root}/{name}", text.encode()))

    def upload(self, local: Path, name: str, files: list[str] | None = None) -> None:
        """A local checkpoint up: a file as one object; a folder's `files` (all of them by default) with
        `trainer.pt` last, which makes it whole."""
        if local.is_file():
            self.retrying(f"saving {name}", lambda: self.fs.put_file(str(local), f"{self.root}/{name}"))
        else:
            chosen = sorted(files if files is not None else os.listdir(local), key=lambda item: item == TRAINER_FILE)
            for item in chosen:
                source, target = str(local / item), f"{self.root}/{name}/{item}"
                self.retrying(f"saving {name}/{item}", partial(self.fs.put_file, source, target))
        if files is None or TRAINER_FILE in files:
            self.last_uploaded = name
            log.info("checkpoint %s is in %s", name, self.shown)

    def wait_for(self, name: str, files: list[str]) -> None:
        """Until every one of `files` is in the store's folder `name` (the other ranks' uploads)."""

        def present() -> None:
            self.fs.invalidate_cache()
            there = {path.rsplit("/", 1)[-1] for path in self.fs.ls(f"{self.root}/{name}", detail=False, refresh=True)}
            if missing := sorted(set(files) - there):
                raise FileNotFoundError(f"{len(missing)} shard files not there yet ({missing[0]})")

        self.retrying(f"waiting for {name}'s shards", present)

    def download(self, name: str, folder: Path) -> Path:
        """A checkpoint of the store into `folder` (file by file, each renamed into place once whole;
        what is there already is kept). Its local path."""
        folder.mkdir(parents=True, exist_ok=True)
        remote, local = f"{self.root}/{name}", folder / name
        if name.endswith(".pt"):
            self.fetch(remote, local)
            return local
        local.mkdir(exist_ok=True)
        items = self.retrying(f"listing {name}", lambda: self.fs.ls(remote, detail=False, refresh=True))
        for item in sorted(items, key=lambda path: path.endswith(TRAINER_FILE)):  # trainer.pt last: whole
            self.fetch(item, local / item.rstrip("/").rsplit("/", 1)[-1])
        return local

    def fetch(self, remote: str, local: Path) -> None:
        if local.exists():
            return
        tmp = local.with_name(f"{TMP_PREFIX}{local.name}.{os.getpid()}")
        try:
            self.retrying(f"reading {remote.rsplit('/', 1)[-1]}", lambda: self.fs.get_file(remote, str(tmp)))
            os.replace(tmp, local)
        finally:
            tmp.unlink(missing_ok=True)

    def prune(self, keep_last: int, keep: frozenset[str] | set[str] = frozenset()) -> None:
        """Keep the newest `keep_last` whole checkpoints and those named in `keep` (keep_best's); remove
        older ones and cut uploads below them."""
        whole = self.names()
        counted = [name for name in whole if name not in keep]
        for name in counted[keep_last:]:
            self.remove(name)
        if not counted:
            return
        oldest_kept = int(NAME_PATTERN.match(counted[:keep_last][-1]).group(1))  # type: ignore[union-attr]
        for entry in self.retrying("listing the checkpoints", lambda: self.fs.ls(self.root, detail=False)):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if (match := NAME_PATTERN.match(name)) and name not in whole and int(match.group(1)) < oldest_kept:
                self.remove(name)  # a folder whose upload a kill cut short

    def remove(self, name: str) -> None:
        self.retrying(f"removing {name}", lambda: self.fs.rm(f"{self.root}/{name}", recursive=True))

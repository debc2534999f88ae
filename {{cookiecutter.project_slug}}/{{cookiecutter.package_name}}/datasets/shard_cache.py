"""A node's local copies of a store's shard files (shards.py): each fetched once per node, shared by its
ranks and their DataLoader workers, the folder kept under a size limit.

- A fetch writes a hidden part file, then renames it: a kill mid-download leaves no file under a
  shard's name, so a reader finds a whole shard or none. A store that fails is retried with waits
  that double, for RETRY_S at most (as checkpoints are, engine/checkpoint/store.py); then one line.
- A lock file per shard (flock, released by the kernel when its holder dies): of two processes that
  need one shard, one downloads it and the other waits, then finds it there.
- A process holds a shared lock on each shard it reads; eviction takes an exclusive lock without
  waiting, least recently used first (each use sets the file's access time), so a shard in use is
  never removed, and the folder holds more than the limit only while the shards in use do.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..common.errors import JobError, first_line
from ..common.object_store import filesystem
from ..common.redaction import redact_text

log = logging.getLogger(__name__)
RETRY_S = 120.0  # how long a failing store is retried before the job stops (a store's restart fits)
FIRST_WAIT_S = 0.5  # the first retry's wait; each one after waits twice as long, up to MAX_WAIT_S
MAX_WAIT_S = 15.0


def cache_folder(cache_dir: str, root: str, dataset_id: str) -> Path:
    """The folder of one prepared data set's cache: under `cache_dir` (by default the system's temp
    dir, node-local and shared by the node's ranks), named by a hash of its root and its id, so a
    data set prepared again at the same root never reads the old one's shards."""
    digest = hashlib.sha256(f"{root}\n{dataset_id}".encode()).hexdigest()[:16]
    return Path(cache_dir or Path(tempfile.gettempdir()) / "shard-cache") / digest


class ShardCache:
    """Local copies of the files under `url` (a store's fsspec URL) in `folder`, at most about
    `limit_bytes` of them. It holds no open file and pickles as its settings: each process makes
    its own client of the store (one inherited through a fork would share its parent's connections)."""

    def __init__(self, url: str, folder: Path, limit_bytes: int) -> None:
        self.url, self.folder, self.limit_bytes = url.rstrip("/"), folder, limit_bytes
        self.client: tuple[int, Any, str] | None = None  # (pid, file system, path of url in it)

    def remote(self, name: str) -> tuple[Any, str]:
        """This process's file system of the store, and the path of file `name` in it."""
        if self.client is None or self.client[0] != os.getpid():
            self.client = (os.getpid(), *filesystem(self.url))
        return self.client[1], f"{self.client[2].rstrip('/')}/{name}"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "client": None}

    def open(self, name: str, size: int) -> tuple[int, Path]:
        """A descriptor of the local copy of shard `name` (`size` bytes), locked as in use until it is
        closed, and its path; the shard fetched first where the node has no copy."""
        path = self.folder / name
        while True:
            if not path.exists():
                self.fetch(name, size)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # evicted between the fetch and the open: fetch again
                continue
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits for an eviction that holds it, if one does
            if same_file(fd, path):
                os.utime(path)  # the access time eviction goes by (a mount's noatime ignores reads)
                return fd, path
            os.close(fd)  # it was evicted while this process waited: fetch it again

    def fetch(self, name: str, size: int) -> None:
        """Download shard `name` unless another process of the node did meanwhile; then evict."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path, part = self.folder / name, self.folder / f".{name}.part"
        with self.locked(name):
            if path.exists():
                return
            self.download(name, part)
            if (got := part.stat().st_size) != size:
                part.unlink()
                raise JobError(f"shard {self.url}/{name} is {got} bytes, its index.json says {size}: the "
                               "data set changed after it was prepared; prepare it again to a new folder")  # fmt: skip
            os.replace(part, path)
        self.evict(keep=name)

    def download(self, name: str, part: Path) -> None:
        """Shard `name` into `part`, retried while the store fails (a restart, a network blip), waits
        doubling from FIRST_WAIT_S, for RETRY_S at most; then one line (JobError)."""
        deadline, wait = time.monotonic() + RETRY_S, FIRST_WAIT_S
        while True:
            fs, remote = self.remote(name)
            try:
                fs.get_file(remote, str(part))
                return
            except Exception as error:  # botocore's, aiohttp's, OSError: all say why
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise JobError(f"shard {redact_text(self.url)}/{name} could not be fetched for {RETRY_S:.0f} s "
                                   f"({redact_text(first_line(error))}): fix the store (address, credentials), "
                                   "then launch again to resume") from error  # fmt: skip
                log.warning("shard %s could not be fetched (%s); retrying in %.1f s", name,
                            redact_text(first_line(error)), wait)  # fmt: skip
                fs.invalidate_cache()
                time.sleep(min(wait, remaining))
                wait = min(2 * wait, MAX_WAIT_S)

    @contextlib.contextmanager
    def locked(self, name: str) -> Iterator[None]:
        """The shard's fetch lock, held by one process of the node at a time."""
        fd = os.open(self.folder / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def evict(self, keep: str = "") -> None:
        """Remove the least recently used shards no process uses until the folder is within the limit."""
        shards = []
        for entry in os.scandir(self.folder):
            if not entry.name.startswith("."):  # lock and part files are not shards
                with contextlib.suppress(FileNotFoundError):
                    shards.append((entry.stat().st_atime, entry.stat().st_size, entry.name))
        total = sum(size for _, size, _ in shards)
        for _, size, name in sorted(shards):
            if total <= self.limit_bytes:
                return
            if name != keep and remove_unused(self.folder / name):
                total -= size

    def size(self) -> int:
        """The bytes of the shards the folder holds now."""
        return sum(path.stat().st_size for path in self.folder.glob("[!.]*"))


def same_file(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is still the file at `path` (not one removed, or removed and fetched anew)."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def remove_unused(path: Path) -> bool:
    """Remove the shard at `path` unless a process holds it (its shared lock); whether it was removed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        if same_file(fd, path):
            os.unlink(path)
            return True
        return False
    finally:
        os.close(fd)

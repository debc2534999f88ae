"""Weights & Biases (log.wandb=true): the run's scalars by step, its resolved config as the run's config.

Online where an API key is set (WANDB_API_KEY, or `wandb login`), offline otherwise or with
log.wandb_mode=offline: each start of the job then writes `<run dir>/wandb/offline-run-*-<id>/`,
all with the same run id, and `wandb sync <run dir>/wandb/offline-run-*` uploads them as one run.
What is sent, and when, is the trackers package's business (__init__.py); this module only speaks W&B.
"""

from __future__ import annotations

import logging
import netrc
import os
import struct
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ....common.run_dir import redact_override
from ....config import LogConfig, require_choice
from .records import Held, Record

log = logging.getLogger(__name__)

# W&B's transaction log (`run-<id>.wandb`): a 7-byte file header, then 32 KiB blocks of records,
# each a 7-byte header (CRC-32 of its type byte and data, length, type) and its data; a record
# that does not fit in a block is split into a first, middle... and last part.
LOG_HEADER = struct.Struct("<4sHB")  # ":W&B", 0xBEE1, version
RECORD_HEADER = struct.Struct("<IHB")
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def api_key_set() -> bool:
    """Whether W&B has an API key here (the environment, or the netrc entry `wandb login` writes),
    told without the network."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    try:
        return netrc.netrc(os.environ.get("NETRC") or None).authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def transaction_log(path: Path) -> Iterator[bytes]:
    """The serialized records of a W&B transaction log, up to the first torn or unwritten one (a
    process killed before W&B flushed leaves the file short)."""
    data = path.read_bytes()
    if len(data) < LOG_HEADER.size or LOG_HEADER.unpack_from(data)[0] != b":W&B":
        return
    position, parts = LOG_HEADER.size, b""
    while True:
        if BLOCK - position % BLOCK < RECORD_HEADER.size:  # the block's tail is padding
            position += BLOCK - position % BLOCK
        if position + RECORD_HEADER.size > len(data):
            return
        checksum, length, kind = RECORD_HEADER.unpack_from(data, position)
        chunk = data[position + RECORD_HEADER.size : position + RECORD_HEADER.size + length]
        if len(chunk) < length or zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != checksum:
            return
        position += RECORD_HEADER.size + length
        parts = chunk if kind in (FULL, FIRST) else parts + chunk
        if kind in (FULL, LAST):
            yield parts


def offline_last_step(wandb_dir: Path, run_id: str) -> int | None:
    """The last history step of run `run_id` in the offline runs under `wandb_dir`, -1 where they
    hold none yet; None where there is no offline run of that id."""
    from wandb.proto import wandb_internal_pb2

    # offline-run-<time>-<id>[-<n>]: W&B numbers the folders of starts within the same second.
    paths = list(wandb_dir.glob(f"offline-run-*/run-{run_id}.wandb"))
    if not paths:
        return None
    last = -1
    for path in paths:
        for data in transaction_log(path):
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # its classes are built at import
            record.ParseFromString(data)
            if record.WhichOneof("record_type") == "history":
                last = max(last, record.history.step.num)
    return last


def check(config: LogConfig) -> None:
    require_choice("log.wandb_mode", config.wandb_mode, ("online", "offline"))


class WandbTracker:
    """One W&B run, created or continued, fed records in step order, one row per step."""

    name = "wandb"

    def __init__(self, config: LogConfig, run_dir: Path) -> None:
        import wandb

        self.wandb = wandb
        self.config = config
        self.run_dir = run_dir
        self.mode = config.wandb_mode
        if self.mode == "online" and not api_key_set():
            log.info("wandb: no API key (WANDB_API_KEY, or `wandb login`): logging offline to %s", run_dir / "wandb")
            self.mode = "offline"
        self.run: Any = None
        # A W&B row, once written, takes no more values, and a step's validation can come after a
        # restart (a stop during its epoch's last step): the newest step's row waits until a later
        # step comes, or the job finishes.
        self.row: dict[str, float] = {}
        self.row_step = -1

    def _init(self, run_id: str | None, plain_config: dict[str, Any] | None = None) -> None:
        # W&B writes the command line into the run (its metadata, read from sys.argv as it starts):
        # it sees the overrides with their secrets redacted, as .hydra/ does; the job keeps the real ones.
        argv, sys.argv = sys.argv, [sys.argv[0], *map(redact_override, sys.argv[1:])]
        try:
            self.run = self.wandb.init(
                project=self.config.wandb_project,
                entity=self.config.wandb_entity or None,
                name=self.run_dir.name,
                id=run_id,
                resume="allow",
                mode=self.mode,
                dir=str(self.run_dir),
                config=plain_config,
                settings=self.wandb.Settings(console="off"),  # the run dir's logs/ already keep the console
            )
        finally:
            sys.argv = argv
        self.row, self.row_step = {}, -1

    def resume(self, run_id: str) -> Held | None:
        if self.mode == "offline":
            last = offline_last_step(self.run_dir / "wandb", run_id)  # read before this start adds its own
            if last is None:
                return None
            self._init(run_id)
        else:
            self._init(run_id)
            last = self.run.step - 1  # the step of its next row: W&B's server knows what the run holds
        return Held(every_name=last)

    def create(self, plain_config: dict[str, Any]) -> str:
        self._init(None, plain_config)  # W&B picks the id
        return self.run.id

    def send(self, records: list[Record]) -> None:
        for record in records:
            if record.step != self.row_step and self.row:
                self.run.log(self.row, step=self.row_step, commit=True)
                self.row = {}
            self.row_step = record.step
            self.row.update(record.scalars)

    def finish(self, outcome: str) -> None:
        if outcome == "FINISHED" and self.row:
            self.run.log(self.row, step=self.row_step, commit=True)
        self.run.finish(exit_code=0 if outcome == "FINISHED" else 1)
        self.run = None
        self.wandb.teardown()  # finish() returns before W&B's own process has written everything down


NAME = "wandb"
TRACKER = WandbTracker

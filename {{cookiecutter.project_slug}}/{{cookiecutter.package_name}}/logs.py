"""Rank-aware logging, set up once per process, and the run's metrics.jsonl.

- every global rank writes everything to `<run dir>/logs/rank_<R>.log`;
- the console shows rank 0's INFO and every rank's WARNING and above, each line prefixed
  with the rank so a warning from rank 5 says where it came from;
- `log.all_ranks_console=true` prints every rank's INFO lines too;
- rank 0 appends one JSON object per log interval and per evaluation to metrics.jsonl.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from .distributed import DistEnv

log = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s %(levelname)s [rank=%(rank)d local_rank=%(local_rank)d pid=%(process)d] %(name)s: %(message)s"
CONSOLE_FORMAT = "[rank=%(rank)d local_rank=%(local_rank)d pid=%(process)d] %(message)s"


class _RankFilter(logging.Filter):
    """Stamps every record with the rank, and lets through console records at min_level or above."""

    def __init__(self, rank: int, local_rank: int, min_level: int = logging.NOTSET, console: bool = False) -> None:
        super().__init__()
        self.rank, self.local_rank, self.min_level, self.console = rank, local_rank, min_level, console

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank, record.local_rank = self.rank, self.local_rank
        if self.console and getattr(record, "file_only", False):  # a traceback kept for the rank's log file
            return False
        return record.levelno >= self.min_level


def setup_logging(run_dir: Path | None, env: DistEnv, all_ranks_console: bool) -> None:
    """Route this process's log records to its rank file and, by rank and level, to the console."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.INFO)

    console = logging.StreamHandler(sys.stderr)
    console_level = logging.INFO if env.is_main or all_ranks_console else logging.WARNING
    console.addFilter(_RankFilter(env.rank, env.local_rank, console_level, console=True))
    console.setFormatter(logging.Formatter(CONSOLE_FORMAT))
    root.addHandler(console)

    if run_dir is not None:
        log_dir = run_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(log_dir / f"rank_{env.rank}.log")
        file_handler.addFilter(_RankFilter(env.rank, env.local_rank))
        file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(file_handler)
    logging.captureWarnings(True)


# metrics.jsonl field -> the name TensorBoard and the trackers plot it under; every val_<metric>
# of the task becomes val/<metric> (val_samples is a count, not plotted).
METRIC_NAMES = {"train_loss": "train/loss", "lr": "train/lr", "samples_per_s": "train/samples_per_s"}


def metric_name(key: str) -> str | None:
    """The plotted name of a metrics.jsonl field; None for the fields that are not scalars to plot."""
    if key in METRIC_NAMES:
        return METRIC_NAMES[key]
    return f"val/{key[4:]}" if key.startswith("val_") and key != "val_samples" else None


class MetricsLog:
    """Appends one JSON object per line to `<run dir>/metrics.jsonl`; a no-op off rank 0.

    `sinks` receive the same records (objects with `write(kind, values)` and `close()`).
    """

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        self.sinks: list[Any] = []

    def write(self, kind: str, **values: Any) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(json.dumps({"kind": kind, **values}) + "\n")
        for sink in self.sinks:
            sink.write(kind, values)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

    def drop_after(self, step: int) -> None:
        """Forget records past `step`: a resumed run redoes those steps and logs them again.

        A line that does not parse (half a line, left by a kill or a full disk) is dropped with a
        warning: it must never stop a resume.
        """
        if not self.enabled or not self.path.exists():
            return
        kept = []
        for number, line in enumerate(self.path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            try:
                record = json.loads(line) if line.strip() else None
            except json.JSONDecodeError:
                record = None
                log.warning("dropping line %d of %s: not a whole JSON record (%.60s)", number, self.path, line)
            if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
                kept.append(line)
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        os.replace(tmp, self.path)


def use_progress_bar(env: DistEnv) -> bool:
    """A progress bar only on rank 0, and only when a person watches a terminal."""
    return env.is_main and sys.stderr.isatty()

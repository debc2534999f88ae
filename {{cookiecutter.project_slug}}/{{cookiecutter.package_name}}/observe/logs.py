"""Rank-aware logging, set up once per process: every rank's records to `<run dir>/logs/rank_<R>.log`; on the
console rank 0's INFO (every rank's with log.all_ranks_console) and every rank's WARNING, prefixed with the rank.
And the run's metrics.jsonl, strict JSON (docs/recipe.md), with its tables beside it (docs/tasks.md).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from ..common.errors import JobError, first_line
from ..common.placement import DistEnv
from ..common.redaction import redact_text

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


class RedactingFormatter(logging.Formatter):
    """Formats as logging does, then hides any password in a URI (tracebacks included)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


class RankLogFile(logging.FileHandler):
    """A rank's log file; one that cannot be written is said once, not a "--- Logging error ---" per record."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        logging.getLogger().removeHandler(self)
        error = sys.exc_info()[1]
        log.warning("%s cannot be written (%s): this rank logs to the console only", self.baseFilename, error)


class RedactingStream:
    """stdout or stderr with any password in a URI hidden, for what libraries print themselves."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(redact_text(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def setup_logging(run_dir: Path | None, env: DistEnv, all_ranks_console: bool) -> None:
    """Route this process's log records to its rank file and, by rank and level, to the console."""
    if not isinstance(sys.stdout, RedactingStream):
        sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stderr)
    console_level = logging.INFO if env.is_main or all_ranks_console else logging.WARNING
    console.addFilter(_RankFilter(env.rank, env.local_rank, console_level, console=True))
    console.setFormatter(RedactingFormatter(CONSOLE_FORMAT))
    root.addHandler(console)
    if run_dir is not None:
        log_dir = run_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        file_handler = RankLogFile(log_dir / f"rank_{env.rank}.log")
        file_handler.addFilter(_RankFilter(env.rank, env.local_rank))
        file_handler.setFormatter(RedactingFormatter(LOG_FORMAT))
        root.addHandler(file_handler)
    logging.captureWarnings(True)


# The train record's figures, plotted as train/<name> (train_loss as train/loss).
TRAIN_FIGURES = ("train_loss", "lr", "samples_per_s", "grad_norm", "tokens_per_s", "peak_memory_mb", "mfu")


def metric_name(key: str) -> str | None:
    """The name TensorBoard and the trackers plot a metrics.jsonl field under: val_<metric> as val/<metric>, a
    callback's figure (holding a "/") as given; None for the fields that are not scalars to plot (val_samples)."""
    if key in TRAIN_FIGURES:
        return "train/loss" if key == "train_loss" else f"train/{key}"
    if "/" in key:
        return key
    return f"val/{key[4:]}" if key.startswith("val_") and key != "val_samples" else None


def strict(value: Any) -> Any:
    """A value as strict JSON holds it: a float that is not finite as its name, a string."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


class MetricsLog:
    """Appends one JSON object per line to `<run dir>/metrics.jsonl` (a no-op off rank 0); `sinks` get them too."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        self.sinks: list[Any] = []

    def write(self, kind: str, **values: Any) -> None:
        if not self.enabled:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as file:
                record = {"kind": kind, **{key: strict(value) for key, value in values.items()}}
                file.write(json.dumps(record, allow_nan=False) + "\n")
        except OSError as error:  # a full disk: no restart would fix it
            raise JobError(
                f"{self.path} cannot be written ({first_line(error)}): free some space or fix the run dir's "
                "permissions, then launch again (training resumes from the last checkpoint)"
            ) from error
        for sink in self.sinks:
            sink.write(kind, values)

    def write_tables(self, tables: dict[str, Any], **values: Any) -> None:
        """Each table to `val_<name>.jsonl` beside metrics.jsonl, with `values` (step, epoch); not to the sinks."""
        for name, table in tables.items():
            table_log = MetricsLog(self.path.with_name(f"val_{name}.jsonl"), self.enabled)
            table_log.write("val", **values, **{f"val_{name}": table})

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

    def drop_after(self, step: int) -> None:
        """Forget records past `step` (a resume redoes those steps); a line that does not parse (half a line, left
        by a kill) is dropped with a warning: it must never stop a resume."""
        if not self.enabled or not self.path.exists():
            return
        for path in [self.path, *self.path.parent.glob("val_*.jsonl")]:  # and write_tables' files beside it
            kept = []
            for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                try:
                    record = json.loads(line) if line.strip() else None
                except json.JSONDecodeError:
                    record = None
                    log.warning("dropping line %d of %s: not a whole JSON record (%.60s)", number, path, line)
                if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
                    kept.append(line)
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            os.replace(tmp, path)


def use_progress_bar(env: DistEnv) -> bool:
    """A progress bar only on rank 0, and only when a person watches a terminal."""
    return env.is_main and sys.stderr.isatty()

"""observe/logs.py: which rank's lines reach the console, the progress bar, metrics.jsonl and its sinks;
credentials kept out of the log lines and the console (tests/conftest.py's fresh_logging gives pytest
its logging back)."""

from __future__ import annotations

import json
import logging
import os
import pty
import sys
from pathlib import Path
from typing import Any

import pytest

from {{cookiecutter.package_name}}.observe.logs import (
    MetricsLog,
    RedactingFormatter,
    RedactingStream,
    setup_logging,
    use_progress_bar,
)

from ..helpers import cpu_env


@pytest.mark.parametrize(
    ("rank", "all_ranks_console", "info_on_console"),
    [(0, False, True), (1, False, False), (1, True, True), (0, True, True)],
)
def test_the_console_shows_rank_zeros_info_and_every_ranks_warnings_unless_all_ranks_are_asked_for(
    fresh_logging, capsys, tmp_path: Path, rank: int, all_ranks_console: bool, info_on_console: bool
) -> None:
    setup_logging(tmp_path, cpu_env(rank, 2), all_ranks_console)  # sys.stderr is capsys's now
    log = logging.getLogger("{{cookiecutter.package_name}}.engine.trainer")
    log.info("epoch 0: train_loss=0.5")
    log.warning("the loss is rising")
    console = capsys.readouterr().err
    assert ("epoch 0: train_loss=0.5" in console) == info_on_console, console
    assert f"[rank={rank} local_rank={rank} pid={os.getpid()}] the loss is rising" in console, "a warning says where"
    for handler in logging.getLogger().handlers:
        handler.flush()
    rank_log = (tmp_path / "logs" / f"rank_{rank}.log").read_text()
    assert "epoch 0: train_loss=0.5" in rank_log and "the loss is rising" in rank_log, "every rank's file: everything"


@pytest.mark.parametrize(("rank", "terminal", "drawn"), [(0, True, True), (0, False, False), (1, True, False)])
def test_the_progress_bar_is_drawn_by_rank_zero_and_only_on_a_terminal(
    monkeypatch, rank: int, terminal: bool, drawn: bool
) -> None:
    # A real terminal (a pseudo-terminal) or a pipe, as under a batch system or with output redirected.
    ours, theirs = pty.openpty() if terminal else os.pipe()
    with open(theirs, "w") as stderr, monkeypatch.context() as patch:
        patch.setattr(sys, "stderr", stderr)
        assert use_progress_bar(cpu_env(rank, 2)) == drawn
    os.close(ours)


class RecordingSink:
    """A sink as MetricsLog takes them: write(kind, values) and close()."""

    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []
        self.closed = False

    def write(self, kind: str, values: dict[str, Any]) -> None:
        self.records.append((kind, values))

    def close(self) -> None:
        self.closed = True


def test_metrics_go_to_the_file_and_every_sink_on_rank_zero_only(tmp_path: Path) -> None:
    main = MetricsLog(tmp_path / "metrics.jsonl", enabled=True)
    main.sinks.append(sink := RecordingSink())
    main.write("train", step=4, train_loss=0.5)
    main.write("val", step=8, val_acc=0.75)
    main.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"kind": "train", "step": 4, "train_loss": 0.5},
        {"kind": "val", "step": 8, "val_acc": 0.75},
    ]
    assert sink.records == [("train", {"step": 4, "train_loss": 0.5}), ("val", {"step": 8, "val_acc": 0.75})]
    assert sink.closed
    other_rank = MetricsLog(tmp_path / "other.jsonl", enabled=False)
    other_rank.sinks.append(quiet := RecordingSink())
    other_rank.write("train", step=4, train_loss=0.5)
    other_rank.drop_after(0)
    assert not (tmp_path / "other.jsonl").exists() and quiet.records == []


def test_a_figure_that_is_not_finite_is_written_as_strict_json_that_reads_back_with_float(tmp_path: Path) -> None:
    """A bare NaN (Python's json default) is rejected by strict readers (jq, JavaScript, Go...)."""
    metrics = MetricsLog(tmp_path / "metrics.jsonl", enabled=True)
    metrics.sinks.append(sink := RecordingSink())
    metrics.write("val", step=3, val_loss=float("nan"), val_acc=float("inf"), val_f1=-float("inf"), val_samples=16)

    def refuse(name: str) -> None:
        raise ValueError(f"not strict JSON: {name}")

    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    record = json.loads(line, parse_constant=refuse)
    assert record == {"kind": "val", "step": 3, "val_loss": "NaN", "val_acc": "Infinity", "val_f1": "-Infinity",
                      "val_samples": 16}  # fmt: skip
    assert [float(record[key]) for key in ("val_acc", "val_f1")] == [float("inf"), -float("inf")]
    assert float(record["val_loss"]) != float(record["val_loss"]), "NaN again"
    assert sink.records[0][1]["val_acc"] == float("inf"), "the sinks take the figures themselves"
    metrics.drop_after(3)
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == [line], "a resume keeps it"


def test_a_resume_drops_the_records_of_the_steps_it_redoes(tmp_path: Path) -> None:
    metrics = MetricsLog(tmp_path / "metrics.jsonl", enabled=True)
    for step in (4, 8, 12, 16):
        metrics.write("train", step=step, train_loss=1.0 / step)
    metrics.write("val", step=16, val_acc=0.5)
    metrics.drop_after(8)
    metrics.write("train", step=12, train_loss=0.1)  # the resumed run logs step 12 again
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [4, 8, 12]


def test_a_torn_last_line_of_metrics_is_dropped_with_a_warning(tmp_path: Path, caplog) -> None:
    path = tmp_path / "metrics.jsonl"
    records = [{"kind": "train", "step": step, "train_loss": 1.0} for step in (10, 20, 30)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"kind": "train", "st')
    metrics = MetricsLog(path, enabled=True)
    metrics.drop_after(20)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [10, 20]
    assert "dropping line 4" in caplog.text


def test_a_full_disk_is_said_once_on_the_console_and_stops_the_metrics_with_one_line(
    tmp_path: Path, capsys, fresh_logging: None
) -> None:
    import errno

    from {{cookiecutter.package_name}}.common.errors import JobError

    setup_logging(tmp_path, cpu_env(0, 1), all_ranks_console=False)
    rank_log = next(h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler))

    def no_space(text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    rank_log.stream.write = no_space
    for number in range(3):
        logging.getLogger("x").info("line %d", number)
    err = capsys.readouterr().err
    assert "Logging error" not in err and err.count("cannot be written") == 1, err
    assert "rank_0.log cannot be written ([Errno 28] No space left on device): this rank logs to the console" in err
    assert "line 2" in err, "the console goes on"
    metrics = MetricsLog(tmp_path / "full" / "metrics.jsonl", enabled=True)  # a folder that is not there
    with pytest.raises(JobError, match=r"metrics.jsonl cannot be written \(FileNotFoundError.*then launch again"):
        metrics.write("train", step=1)


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

"""records.py: what a tracker is sent (metrics.jsonl records as scalars by metric name) and what it lacks."""

from __future__ import annotations

import json
from pathlib import Path

from {{cookiecutter.package_name}}.observe.sinks.trackers.records import Held, Record, read_records


def test_a_record_keeps_the_scalars_under_their_metric_names_and_drops_the_rest() -> None:
    values = {"kind": "train", "step": 8, "epoch": 0, "train_loss": 0.5, "lr": 0.1, "samples_per_s": 900,
              "val_loss": 0.7, "val_acc": 1, "val_samples": 999}  # fmt: skip
    record = Record.from_values(values)
    assert record.step == 8
    assert record.scalars == {"train/loss": 0.5, "train/lr": 0.1, "train/samples_per_s": 900.0,
                              "val/loss": 0.7, "val/acc": 1.0}  # fmt: skip
    assert all(type(value) is float for value in record.scalars.values()), "ints become floats"


def test_read_records_keeps_the_order_and_skips_what_does_not_parse(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [
        json.dumps({"kind": "train", "step": 4, "train_loss": 0.9}),
        '{"kind": "train", "step": 8, "train_lo',  # cut off by a kill mid-write
        "[1, 2]",  # not a record
        json.dumps({"kind": "train", "step": "12", "train_loss": 0.1}),  # a step that is not a number
        json.dumps({"kind": "val", "train_loss": 0.1}),  # no step
        json.dumps({"kind": "val", "step": 8, "val_loss": 0.7, "val_samples": 10}),
    ]
    torn = b'{"kind": "train", "step": 9, "train_loss": 0.\xff\xfe'  # bytes that are not UTF-8, in a torn line
    path.write_bytes(("\n".join(lines[:2]) + "\n").encode() + torn + ("\n" + "\n".join(lines[2:]) + "\n").encode())
    records = read_records(path)
    assert records == [Record(4, {"train/loss": 0.9}), Record(8, {"val/loss": 0.7})]


def test_a_run_without_a_metrics_file_has_no_records(tmp_path: Path) -> None:
    assert read_records(tmp_path / "metrics.jsonl") == []
    assert read_records(tmp_path) == [], "a folder is not a file of records"


def test_held_missing_returns_only_the_scalars_a_run_lacks() -> None:
    records = [
        Record(4, {"train/loss": 0.9, "train/lr": 0.1}),
        Record(8, {"train/loss": 0.8, "train/lr": 0.1, "val/loss": 0.7}),
        Record(12, {"train/loss": 0.6, "train/lr": 0.05}),
    ]
    held = Held({"train/loss": 8, "val/loss": 8}, every_name=4)  # lr: only up to step 4, as every metric
    assert held.missing(records) == [
        Record(8, {"train/lr": 0.1}),
        Record(12, {"train/loss": 0.6, "train/lr": 0.05}),
    ]
    assert Held().missing(records) == records, "an empty run lacks everything"
    assert Held(every_name=12).missing(records) == [], "a run holding every metric to step 12 lacks nothing"


def test_held_knows_each_metrics_last_step_and_the_newest() -> None:
    held = Held({"train/loss": 16, "val/loss": 8}, every_name=4)
    assert (held.last("train/loss"), held.last("val/loss"), held.last("train/lr")) == (16, 8, 4)
    assert held.newest() == 16
    assert Held({"train/loss": 3}, every_name=9).newest() == 9, "rows of every metric, newer than any one metric"
    assert Held().newest() == -1 and Held().last("train/loss") == -1

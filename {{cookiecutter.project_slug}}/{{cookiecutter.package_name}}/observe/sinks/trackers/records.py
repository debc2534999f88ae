"""What a tracker back-end (`<name>_tracker.py` beside this file) works with: the records it is sent,
what its run already holds, and the interface it implements (Tracker)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...logs import metric_name


@dataclass(frozen=True)
class Record:
    """One metrics.jsonl record as a tracker takes it: its step and its scalars by metric name."""

    step: int
    scalars: dict[str, float]

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> Record:
        names = {key: metric_name(key) for key in values}
        return cls(values["step"], {name: float(values[key]) for key, name in names.items() if name is not None})


def read_records(path: Path) -> list[Record]:
    """The records of a metrics.jsonl, in order; a line that does not parse is skipped."""
    records = []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
    for line in lines:
        try:
            values = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(values, dict) and isinstance(values.get("step"), int):
            records.append(Record.from_values(values))
    return records


@dataclass
class Held:
    """What a tracker run already holds: the last step of each metric, -1 for none."""

    by_name: dict[str, int] = field(default_factory=dict)
    every_name: int = -1  # for a tracker whose rows hold all the metrics of a step at once

    def last(self, name: str) -> int:
        return self.by_name.get(name, self.every_name)

    def newest(self) -> int:
        return max([self.every_name, *self.by_name.values()])

    def missing(self, records: list[Record]) -> list[Record]:
        """The parts of `records` that the run does not hold yet."""
        kept = [Record(r.step, {n: v for n, v in r.scalars.items() if r.step > self.last(n)}) for r in records]
        return [record for record in kept if record.scalars]


class Tracker(Protocol):
    """One tracker's run, used from the trackers' thread only."""

    name: str

    def resume(self, run_id: str) -> Held | None:
        """Continue run `run_id`: what it holds; None where there is no such run."""

    def create(self, plain_config: dict[str, Any]) -> str:
        """Start a new run with the resolved config as its parameters: its id."""

    def send(self, records: list[Record]) -> None:
        """Log the records (in step order) to the run."""

    def finish(self, outcome: str) -> None:
        """End the run: FINISHED, KILLED (stopped by a signal, to be resumed) or FAILED."""

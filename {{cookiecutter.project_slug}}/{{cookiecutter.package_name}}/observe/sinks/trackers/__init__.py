"""Experiment-tracker runs that survive restarts, every step logged once (docs/trackers.md).

Rank 0 sends each tracker switched on under `log.` the scalars metrics.jsonl receives.

- A tracker cannot take a point back, and the steps past the last checkpoint are the ones a
  resume redoes: so a record is sent only once a checkpoint at or after its step is on disk
  (`commit`, called by the checkpoint writer when it has written one).
- A resume first sends, from metrics.jsonl (already cut back to the resumed step), what the
  tracker run lacks: records committed but not yet delivered when the job died.
- The run ids are kept in `<run dir>/trackers.json` and in every checkpoint, so a torchrun
  restart, a requeue or a relaunch with the same run dir continues the same tracker runs.
- Imports, connections and sends happen on a thread of the trackers' own: a slow or unreachable
  server never holds a training step, and a failing tracker is dropped with a warning.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import pkgutil
import queue
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ....common.errors import ConfigError, Preempted, first_line
from ....config import LogConfig
from .records import Held, Record, Tracker, read_records

log = logging.getLogger(__name__)

IDS_FILE = "trackers.json"  # in the run dir: {tracker name: run id}
CLOSE_TIMEOUT_S = 60.0  # how long the end of a job waits for the trackers to take the last records


def tracker_modules() -> dict[str, ModuleType]:
    """The trackers this project has, by name: the `<name>_tracker.py` modules beside this file (chosen
    when the project was made), each with its NAME (the package it needs, and its `log.<NAME>` switch)
    and TRACKER class."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if not info.name.endswith("_tracker"):
            continue  # records.py: what they share
        module = importlib.import_module(f".{info.name}", __name__)
        found[module.NAME] = module
    return found


def switched_on(config: LogConfig) -> list[str]:
    """The trackers that log.<name>=true turns on."""
    return [name for name in tracker_modules() if config.get(name)]


def check_installed(config: LogConfig) -> None:
    """A tracker switched on needs its package: say so in one line before anything starts."""
    for name in switched_on(config):
        if importlib.util.find_spec(name) is None:
            raise ConfigError(
                f"log.{name}=true but {name} is not installed: pip install {name} (or pip install -e '.[{name}]'), "
                f"or set log.{name}=false"
            )


def check(config: LogConfig) -> None:
    """What a launch checks of the trackers before anything starts: each one switched on is installed,
    and its server (where it has one to reach) answers: its client would retry for most of a minute,
    and then not say which server it tried."""
    check_installed(config)
    modules = tracker_modules()
    for name in switched_on(config):
        if hasattr(modules[name], "check"):
            modules[name].check(config)


def build_tracker(name: str, config: LogConfig, run_dir: Path) -> Tracker:
    """The tracker `name`; its module imports the tracker's package, which only a run that uses it needs."""
    return tracker_modules()[name].TRACKER(config, run_dir)


def build(config: LogConfig, run_dir: Path, env: Any) -> Trackers:
    """This sink of observe/sinks/: the run's tracker runs (no thread, no connection until `start`)."""
    return Trackers(config, run_dir)


def read_ids(run_dir: Path) -> dict[str, str]:
    """The run ids kept in the run dir; none where the file is missing or unreadable."""
    path = run_dir / IDS_FILE
    try:
        ids = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, json.JSONDecodeError) as error:
        log.warning("ignoring %s (%s): the trackers start new runs", path, error)
        return {}
    return {name: run_id for name, run_id in ids.items() if isinstance(run_id, str)} if isinstance(ids, dict) else {}


def write_ids(run_dir: Path, ids: dict[str, str]) -> None:
    path = run_dir / IDS_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(ids, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)  # a kill mid-write leaves the old file whole


@dataclass(frozen=True)
class _Closing:
    """The last item on the trackers' queue: end the runs with this outcome."""

    outcome: str


class Trackers:
    """The run's tracker runs: a metrics sink on rank 0 that sends a record once a checkpoint covers it.

    `write` runs on the training thread, `commit` on the checkpoint writer's, everything else of the
    trackers on their own thread, fed through a queue.
    """

    def __init__(
        self, config: LogConfig, run_dir: Path, builder: Callable[[str, LogConfig, Path], Tracker] = build_tracker
    ) -> None:
        check_installed(config)  # on every rank alike, before any collective: all stop together
        self.config = config
        self.run_dir = run_dir
        self.run_ids: dict[str, str] = {}  # replaced whole, never changed in place: other threads read it
        self._builder = builder
        self._pending: list[Record] = []  # written, not yet covered by a checkpoint
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[list[Record] | _Closing] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's `trackers`: the run ids, so that a resume continues the same runs."""
        return {"trackers": dict(self.run_ids)}

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        """The exact inverse of state_dict() (a checkpoint from before trackers has none)."""
        self.run_ids = dict(payload.get("trackers", {}))

    def start(self, resumed_step: int, metrics_path: Path, plain_config: dict[str, Any], own_checkpoint: bool) -> None:
        """Open the trackers' runs on their thread, continuing the run dir's (or the checkpoint's) and
        first sending them what metrics.jsonl holds and they lack. Rank 0 only.

        `own_checkpoint`: whether the resumed checkpoint is this run dir's; another run's checkpoint
        (checkpoint.resume=PATH) starts new tracker runs, so that its runs get no foreign steps.
        """
        names = switched_on(self.config)
        if not names:
            return
        saved = self.run_ids if own_checkpoint else {}
        self.run_ids = {**saved, **read_ids(self.run_dir)}  # the run dir's file is the newer
        history = read_records(metrics_path)  # now: the training thread appends to it from here on
        args = (names, resumed_step, history, plain_config)
        self._thread = threading.Thread(target=self._serve, args=args, name="trackers", daemon=True)
        self._thread.start()

    def write(self, kind: str, values: dict[str, Any]) -> None:
        """A metrics.jsonl record: held until a checkpoint covers its step."""
        if self._thread is None:
            return
        record = Record.from_values(values)
        if record.scalars:
            with self._lock:
                self._pending.append(record)

    def commit(self, step: int) -> None:
        """The checkpoint of `step` is on disk: no resume redoes the steps up to it, so send their records."""
        with self._lock:
            ready = [record for record in self._pending if record.step <= step]
            self._pending = [record for record in self._pending if record.step > step]
        if ready:
            self._queue.put(ready)

    def close(self) -> None:
        """Deliver what checkpoints covered and end the runs; what they did not cover is dropped (a
        resume redoes it). Called from Trainer.fit's `finally`, where the exception on its way out,
        if any, says how the job ended."""
        if self._thread is None:
            return
        error = sys.exc_info()[1]
        outcome = "FINISHED" if error is None else "KILLED" if isinstance(error, Preempted) else "FAILED"
        self._queue.put(_Closing(outcome))
        self._thread.join(CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            log.warning(
                "the trackers did not finish within %.0f s; the next launch on this run dir sends them what they lack",
                CLOSE_TIMEOUT_S,
            )
        self._thread = None

    def _serve(self, names: list[str], resumed_step: int, history: list[Record], plain_config: dict[str, Any]) -> None:
        live = []
        for name in names:
            try:
                tracker = self._builder(name, self.config, self.run_dir)
                self._open(tracker, resumed_step, history, plain_config)
                live.append(tracker)
            except Exception as error:
                self._give_up(name, "could not open its run", error)
        try:
            write_ids(self.run_dir, self.run_ids)
        except OSError as error:  # the checkpoints still keep the ids
            log.warning("could not write %s (%s)", self.run_dir / IDS_FILE, first_line(error))
        while not isinstance(item := self._queue.get(), _Closing):
            for tracker in list(live):
                try:
                    tracker.send(item)
                except Exception as error:
                    live.remove(tracker)
                    self._give_up(tracker.name, "could not take the metrics", error)
        for tracker in live:
            try:
                tracker.finish(item.outcome)
            except Exception as error:
                log.warning("%s: could not end its run (%s)", tracker.name, error)

    def _open(self, tracker: Tracker, resumed_step: int, history: list[Record], plain_config: dict[str, Any]) -> None:
        run_id = self.run_ids.get(tracker.name)
        held = tracker.resume(run_id) if run_id else None
        if held is not None and held.newest() > resumed_step:
            # Resumed from an older checkpoint than the tracker saw: the steps it would log again go to a new run.
            log.warning(
                "%s run %s holds steps up to %d, past step %d that training resumes from: continuing in a new run",
                tracker.name, run_id, held.newest(), resumed_step,
            )  # fmt: skip
            tracker.finish("KILLED")
            held = None
        if held is None:
            run_id, held = tracker.create(plain_config), Held()
            log.info("%s: new run %s", tracker.name, run_id)
        else:
            holds = f"it holds steps up to {held.newest()}" if held.newest() >= 0 else "it holds no step yet"
            log.info("%s: continuing run %s (%s)", tracker.name, run_id, holds)
        assert run_id is not None  # a run is held only by its id
        self.run_ids = {**self.run_ids, tracker.name: run_id}
        if missing := held.missing(history):
            tracker.send(missing)

    def _give_up(self, name: str, what: str, error: Exception) -> None:
        log.warning(
            "%s %s (%s); training goes on without it: metrics.jsonl keeps every record, and the next launch on "
            "this run dir sends the %s run what it lacks",
            name, what, first_line(error), name,
        )  # fmt: skip

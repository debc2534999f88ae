"""The settings of the profiler (observe/profiling.py): the trainer section's `profile_steps` and
`memory_snapshot`; and `skip_samples`, the samples a relaunch leaves out (engine/nonfinite.py reads it).
schema.py's TrainerConfig has a field for each of SECTION_FIELDS' "trainer", found by what is present; their
rules, and that a resume may change the profiler's (compatibility.py). No torch."""

from __future__ import annotations

from typing import Any

from .values import require

# section -> {key: (type, default)}: train.yaml gives each its default and its meaning.
SECTION_FIELDS = {
    "trainer": {"profile_steps": (str, ""), "memory_snapshot": (bool, False), "skip_samples": (Any, None)}
}
OPERATIONAL_KEYS = ("trainer.profile_steps", "trainer.memory_snapshot")  # what a resume may change: the traces


def step_range(key: str, value: str) -> tuple[int, int] | None:
    """START:END, optimizer steps numbered as in metrics.jsonl (1: the first); "" is None (off)."""
    if value == "":
        return None
    first, colon, last = value.partition(":")
    require(
        colon == ":" and first.isdigit() and last.isdigit() and int(first) >= 1,
        f"{key}={value!r} is not START:END, steps numbered from 1: give e.g. {key}=5:8 (or 5:5 for one step)",
    )
    swapped = f"{max(int(last), 1)}:{first}"
    require(int(first) <= int(last), f"{key}={value}: START is after END; give START <= END, e.g. {key}={swapped}")
    return int(first), int(last)


def check_section(section: str, config: Any) -> None:
    if section == "trainer":
        profiled = step_range("trainer.profile_steps", config.profile_steps)
        require(
            profiled is not None or not config.memory_snapshot,
            "trainer.memory_snapshot=true records the steps of trainer.profile_steps: set that too, e.g. "
            "trainer.profile_steps=5:8",
        )

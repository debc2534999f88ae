"""-m: a sweep, each point its own torchrun job (sweep_point.run_point), one after another in one sweep dir,
or with SUBMIT=slurm each its own Slurm job (cluster_sweep.py); a table of the points and their final
figures (results.md). Its launch keys (KEYS) are run_single.sh's where the project has this module."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import cast

from .checks import describe_composition_error
from .job import new_dir
from .keys import Key, LaunchArgs, LaunchError
from .optuna_sweep import optuna_sweep
from .plan import Launch
from .supervise import Forwarder
from .sweep_point import run_point

KEYS = (
    Key("SWEEP_DIR", "", "with -m: the sweep's dir (default: a new outputs/sweep_<date>_<time>); "
        "an existing one is continued", modes=("single",)),
    Key("SUBMIT", "", "with -m: slurm submits each point as its own Slurm job and waits for them (docs/sweeps.md); "
        "\"\": one after another here", modes=("single",)),
    Key("SUBMIT_ARGS", "", "with SUBMIT=slurm: each point's submission options, e.g. SUBMIT_ARGS='--time=4:00:00'",
        modes=("single",)),
)  # fmt: skip


def sweep_points(overrides: list[str]) -> list[list[str]]:
    """Hydra's basic sweep: the cartesian product of every comma list (and range/choice) given."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as error:
        raise LaunchError(describe_composition_error(error)) from None
    axes = []
    for override in parsed:
        key = override.get_key_element()
        if override.is_sweep_override():
            axes.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            axes.append([cast(str, override.input_line)])  # set by the parser
    return [list(point) for point in itertools.product(*axes)]


def point_dir_name(index: int, point: list[str], swept: set[str]) -> str:
    label = ",".join(item for item in point if item.split("=", 1)[0].lstrip("+~") in swept)
    return f"{index:03d}_" + re.sub(r"[^A-Za-z0-9._=,+-]", "_", label)[:120]


def sweep(launch: Launch, args: LaunchArgs, forwarder: Forwarder) -> int:
    """Each point of the sweep as its own torchrun job, one after another, in its own run dir of
    one sweep dir; a table of the points and their final figures at the end (results.md)."""
    if "${" in launch.values["SWEEP_DIR"]:
        raise LaunchError(f"SWEEP_DIR={launch.values['SWEEP_DIR']}: a sweep dir holds the runs of several configs, "
                          "so it cannot follow one (${...}): give a plain path")  # fmt: skip
    if launch.values["SUBMIT"] not in ("", "slurm"):
        raise LaunchError(f"SUBMIT={launch.values['SUBMIT']}: give SUBMIT=slurm (each point a job) or leave it out")
    if Path(launch.values["SWEEP_DIR"]).is_file():
        raise LaunchError(f"SWEEP_DIR={launch.values['SWEEP_DIR']} is a file: give a folder")
    sweep_dir = Path(launch.values["SWEEP_DIR"]) if launch.values["SWEEP_DIR"] else new_dir("sweep_")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    swept = {item.split("=", 1)[0] for item in args.overrides if "," in item or "(" in item}
    if any(item.startswith("hydra/sweeper=optuna") for item in args.overrides):
        rows = optuna_sweep(launch, args.overrides, sweep_dir, forwarder)
    elif launch.values["SUBMIT"] == "slurm":  # each point its own Slurm job (cluster_sweep.py)
        cluster_sweep = submitting_module()
        points = sweep_points(args.overrides)
        print(f"sweep dir: {sweep_dir} ({len(points)} points, each a Slurm job)", flush=True)
        named = [(index, point, sweep_dir / point_dir_name(index, point, swept)) for index, point in enumerate(points)]
        rows = cluster_sweep(launch, named)
    else:
        points = sweep_points(args.overrides)
        print(f"sweep dir: {sweep_dir} ({len(points)} points)", flush=True)
        rows = []
        for index, point in enumerate(points):
            rows.append(run_point(launch, index, point, sweep_dir / point_dir_name(index, point, swept), forwarder))
            if rows[-1]["status"] == "stopped":
                break
    if rows and rows[-1]["status"] == "stopped":
        print(f"sweep stopped by a signal: launch again with SWEEP_DIR={sweep_dir} to continue", flush=True)
        return 128 + forwarder.signal
    table = results_table(rows, swept)
    (sweep_dir / "results.md").write_text(table)
    print(table, end="", flush=True)
    print(f"sweep dir: {sweep_dir} (results.md)", flush=True)
    return 0 if all(row["status"] == "done" for row in rows) else 1


def check_one_job(launch: Launch) -> None:
    """A launch without -m: this module's keys are a sweep's, refused there in one line."""
    if launch.values.get("SUBMIT") or launch.values.get("SUBMIT_ARGS"):
        raise LaunchError("SUBMIT and SUBMIT_ARGS submit a sweep's points: give -m and a sweep, or leave them out")


def submitting_module():  # noqa: ANN201
    """cluster_sweep.cluster_sweep, in a project made with Slurm support (cookiecutter's slurm=yes)."""
    import importlib

    try:
        return importlib.import_module(f"{__package__}.cluster_sweep").cluster_sweep
    except ModuleNotFoundError:
        raise LaunchError("SUBMIT=slurm: this project was made without Slurm support (slurm=no)") from None


def results_table(rows: list[dict], swept: set[str] | None = None) -> str:
    """The points (their swept overrides) and their final validation figures, as a Markdown table."""
    metrics = sorted({k for row in rows for k in row["final"] if k.startswith("val_")}, key=metric_order)
    header = ["point", "overrides", "status", *metrics]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        figures = [format_figure(row["final"].get(name)) for name in metrics]
        status = row["status"] + (f" ({row['reason']})" if row["status"] == "failed" and row["reason"] else "")
        shown = [item for item in row["overrides"] if swept is None or item.split("=", 1)[0].lstrip("+~") in swept]
        lines.append("| " + " | ".join([str(row["point"]), " ".join(shown), status, *figures]) + " |")
    return "\n".join(lines) + "\n"


def metric_order(name: str) -> tuple[int, str]:
    return ({"val_loss": 0, "val_samples": 2}.get(name, 1), name)


def format_figure(value: object) -> str:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)
